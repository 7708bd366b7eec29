/* A decompressed remote-write WriteRequest read in one C pass, as columns (optional: wire.py's
 * Python decoder is the fallback and the reference; tests/prometheus/test_decode_c.py checks the
 * two agree on every body, valid or not).
 *
 * Why: the receiver's steady state is ~2,000 one-sample series per body. Python found the
 * series with numpy passes over the whole body and then sliced each key out one by one
 * (~1.2 ms a body); this is one walk of the bytes.
 *
 * scan(raw) -> None | (keys, first, ts_ms, values, histograms, metadata, single)
 *   keys        list of bytes: each TimeSeries' label fields as sent (wire.Series.key)
 *   first       int64[nseries + 1] (bytearray): series i's samples are [first[i], first[i+1])
 *   ts_ms       int64[nsamples] (bytearray), values float64[nsamples] (bytearray)
 *   histograms  int64[nseries] (bytearray): native histograms counted per series
 *   metadata    list of (family name bytes, MetricType) in body order, as wire._metadata keeps them
 *   single      True when every series has exactly one sample and no histogram
 * ValueError(message): the body is malformed; the message is the Python decoder's (wire.decode
 * prefixes "malformed WriteRequest protobuf: "), found at the same byte in the same order:
 * this is wire._decode/_series/_sample/_metadata/_skip/_varint transcribed, reads bounded by
 * the body's end exactly where Python's indexing raises IndexError ("truncated") or
 * struct.unpack_from raises ("truncated inside a sample value").
 * None: the Python decoder must read the body (it can be valid): a label after a series'
 * samples (its key is two slices), a length of 2**48 or more (offsets in the messages would
 * need Python's big ints), a timestamp or metadata type varint of 2**64 or more.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BIG ((uint64_t)1 << 48) /* no body is this long: a length this large hands the body to Python */

enum { OK = 0, FAIL = 1, PYTHON = 2 };

typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} Vec; /* int64 or float64 (same size) growable array */

typedef struct {
    const uint8_t *buf;
    int64_t end;
    int state;
    char msg[128];
    PyObject *keys, *meta;
    Vec first, ts, val, hist;
} Ctx;

static int push(Ctx *c, Vec *v, int64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 256;
        int64_t *p = PyMem_Realloc(v->p, (size_t)cap * sizeof *p);
        if (!p) {
            PyErr_NoMemory();
            c->state = FAIL;
            c->msg[0] = 0; /* a Python error is set: not a protocol error */
            return -1;
        }
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

/* The failure states: a message (ValueError), or the Python decoder's turn. Return -1 so the
 * callers can write `return fail(...)`. */
static int64_t fail(Ctx *c, const char *fmt, long long a, long long b) {
    c->state = FAIL;
    PyOS_snprintf(c->msg, sizeof c->msg, fmt, a, b);
    return -1;
}

static int64_t to_python(Ctx *c) {
    c->state = PYTHON;
    return -1;
}

#define TRUNCATED(c) fail((c), "truncated", 0, 0) /* Python's IndexError */

/* wire._varint: the low 64 bits in *out, *over when the value is 2**64 or more (a 10th byte
 * above 1). Returns the position after it, -1 on error. */
static int64_t varint(Ctx *c, int64_t pos, uint64_t *out, int *over) {
    uint64_t r = 0;
    int shift = 0;
    *over = 0;
    while (pos < c->end) {
        uint64_t b = c->buf[pos++];
        r |= (b & 0x7F) << shift;
        if (shift == 63 && (b & 0x7F) > 1) *over = 1;
        if (b < 0x80) {
            *out = r;
            return pos;
        }
        shift += 7;
        if (shift > 63) return fail(c, "varint longer than 10 bytes at offset %lld", pos, 0);
    }
    return fail(c, "truncated varint at offset %lld", pos, 0);
}

/* A varint that is a length: one of 2**48 or more is Python's to report. */
static int64_t length(Ctx *c, int64_t pos, int64_t *n) {
    uint64_t v;
    int over;
    pos = varint(c, pos, &v, &over);
    if (pos < 0) return -1;
    if (over || v >= BIG) return to_python(c);
    *n = (int64_t)v;
    return pos;
}

/* wire._skip */
static int64_t skip(Ctx *c, int64_t pos, int wire) {
    uint64_t v;
    int over;
    int64_t n;
    switch (wire) {
    case 0:
        return varint(c, pos, &v, &over);
    case 1:
        return pos + 8;
    case 2:
        pos = length(c, pos, &n);
        return pos < 0 ? -1 : pos + n;
    case 5:
        return pos + 4;
    default:
        return fail(c, "unsupported protobuf wire type %lld at offset %lld", wire, pos);
    }
}

static inline double get_double(const uint8_t *p) {
    double v;
#if PY_LITTLE_ENDIAN
    memcpy(&v, p, 8);
#else
    uint8_t b[8];
    for (int k = 0; k < 8; k++) b[k] = p[7 - k];
    memcpy(&v, b, 8);
#endif
    return v;
}

/* wire._sample: appends (ts, value); 0 or -1 */
static int sample(Ctx *c, int64_t pos, int64_t stop) {
    double value = 0.0;
    int64_t ts = 0;
    uint64_t v;
    int over;
    while (pos < stop) {
        if (pos >= c->end) return (int)TRUNCATED(c);
        uint8_t tag = c->buf[pos];
        if (tag == 0x09) {
            if (pos + 9 > c->end) return (int)fail(c, "truncated inside a sample value", 0, 0);
            value = get_double(c->buf + pos + 1);
            pos += 9;
        } else if (tag == 0x10) {
            pos = varint(c, pos + 1, &v, &over);
            if (pos < 0) return -1;
            if (over) return (int)to_python(c);
            ts = (int64_t)v; /* Python: ts - 2**64 when ts >= 2**63 */
        } else {
            pos = varint(c, pos, &v, &over);
            if (pos < 0) return -1;
            pos = skip(c, pos, (int)(v & 7));
            if (pos < 0) return -1;
        }
    }
    if (pos != stop) return (int)fail(c, "sample ending at offset %lld is malformed", stop, 0);
    if (push(c, &c->ts, ts)) return -1;
    int64_t bits;
    memcpy(&bits, &value, 8);
    return push(c, &c->val, bits);
}

/* wire._series: appends the key, the samples and the histogram count; 0 or -1 */
static int series(Ctx *c, int64_t pos, int64_t stop) {
    const int64_t start = pos;
    int64_t n;
    uint64_t t;
    int over;
    while (pos < stop && c->buf[pos] == 0x0A) { /* labels first: only where they end */
        if (pos + 1 >= c->end) return (int)TRUNCATED(c);
        uint8_t b = c->buf[pos + 1];
        if (b < 0x80) {
            pos += 2 + b;
        } else {
            pos = length(c, pos + 1, &n);
            if (pos < 0) return -1;
            pos += n;
        }
    }
    const int64_t key_end = pos;
    int64_t hist = 0;
    while (pos < stop) {
        uint8_t tag = c->buf[pos];
        if (tag == 0x12) {
            if (pos + 1 >= c->end) return (int)TRUNCATED(c);
            uint8_t b = c->buf[pos + 1];
            if (b < 0x80) {
                n = b;
                pos += 2;
            } else {
                pos = length(c, pos + 1, &n);
                if (pos < 0) return -1;
            }
            if (sample(c, pos, pos + n)) return -1;
            pos += n;
            continue;
        }
        int64_t p2 = varint(c, pos, &t, &over);
        if (p2 < 0) return -1;
        if (!over && t == 0x0A) return (int)to_python(c); /* a label after samples: a key of two slices */
        if (!over && t == 0x22) hist++;
        pos = skip(c, p2, (!over && t == 0x22) ? 2 : (int)(t & 7));
        if (pos < 0) return -1;
    }
    if (pos != stop) return (int)fail(c, "timeseries ending at offset %lld is malformed", stop, 0);
    /* pos == stop and the walk only moves forward: start <= key_end <= stop <= end */
    PyObject *key = PyBytes_FromStringAndSize((const char *)c->buf + start, (Py_ssize_t)(key_end - start));
    if (!key || PyList_Append(c->keys, key)) {
        Py_XDECREF(key);
        c->state = FAIL;
        c->msg[0] = 0;
        return -1;
    }
    Py_DECREF(key);
    if (push(c, &c->hist, hist)) return -1;
    return push(c, &c->first, c->ts.n);
}

/* wire._metadata: appends (name, kind) when the entry names a family; 0 or -1 */
static int metadata(Ctx *c, int64_t pos, int64_t stop) {
    uint64_t tag, kind = 0, v;
    int over, kover;
    int64_t name_a = 0, name_b = 0, n;
    while (pos < stop) {
        pos = varint(c, pos, &tag, &over);
        if (pos < 0) return -1;
        if (!over && tag == 0x08) {
            pos = varint(c, pos, &v, &kover);
            if (pos < 0) return -1;
            if (kover) return (int)to_python(c);
            kind = v;
        } else if (!over && tag == 0x12) {
            pos = length(c, pos, &n);
            if (pos < 0) return -1;
            /* raw[pos:pos + n]: a slice, clamped to the body */
            name_a = pos < c->end ? pos : c->end;
            name_b = pos + n < c->end ? pos + n : c->end;
            pos += n;
        } else {
            pos = skip(c, pos, (int)(tag & 7));
            if (pos < 0) return -1;
        }
    }
    if (name_b > name_a) {
        PyObject *item = Py_BuildValue("(y#K)", (const char *)c->buf + name_a, (Py_ssize_t)(name_b - name_a),
                                       (unsigned long long)kind);
        if (!item || PyList_Append(c->meta, item)) {
            Py_XDECREF(item);
            c->state = FAIL;
            c->msg[0] = 0;
            return -1;
        }
        Py_DECREF(item);
    }
    return 0;
}

/* wire._decode */
static int walk(Ctx *c) {
    const uint8_t *buf = c->buf;
    const int64_t end = c->end;
    int64_t pos = 0, n;
    uint64_t tag;
    int over;
    if (push(c, &c->first, 0)) return -1;
    while (pos < end) {
        if (buf[pos] == 0x0A) { /* timeseries (field 1, length-delimited) */
            if (pos + 1 >= end) return (int)TRUNCATED(c);
            uint8_t b = buf[pos + 1];
            if (b < 0x80) {
                n = b;
                pos += 2;
            } else {
                if (pos + 2 >= end) return (int)TRUNCATED(c);
                if (buf[pos + 2] < 0x80) {
                    n = (b & 0x7F) | (int64_t)buf[pos + 2] << 7;
                    pos += 3;
                } else {
                    pos = length(c, pos + 1, &n);
                    if (pos < 0) return -1;
                }
            }
            int64_t stop = pos + n;
            if (stop > end) return (int)fail(c, "timeseries at offset %lld runs past the end of the body", pos, 0);
            if (series(c, pos, stop)) return -1;
            pos = stop;
            continue;
        }
        pos = varint(c, pos, &tag, &over);
        if (pos < 0) return -1;
        if (!over && tag == 0x1A) { /* metadata (field 3) */
            pos = length(c, pos, &n);
            if (pos < 0) return -1;
            if (metadata(c, pos, pos + n)) return -1;
            pos += n;
        } else {
            pos = skip(c, pos, (int)(tag & 7));
            if (pos < 0) return -1;
        }
    }
    if (pos != end) return (int)fail(c, "protobuf body ends inside a field", 0, 0);
    return 0;
}

static PyObject *column(const Vec *v) {
    return PyByteArray_FromStringAndSize(v->n ? (const char *)v->p : "", v->n * (Py_ssize_t)sizeof(int64_t));
}

/* The answer's tuple from a finished walk: scan's seven items, and scan_v2's exemplar count
 * as an eighth where ``exemplars`` >= 0. */
static PyObject *answer(Ctx *c, long long exemplars) {
    PyObject *out = NULL;
    int single = c->ts.n == c->hist.n; /* as many samples as series, and one each: */
    for (Py_ssize_t i = 0; single && i < c->hist.n; i++)
        single = c->hist.p[i] == 0 && c->first.p[i + 1] == i + 1;
    PyObject *first = column(&c->first), *ts = column(&c->ts), *val = column(&c->val), *hist = column(&c->hist);
    if (first && ts && val && hist) {
        PyObject *one = single ? Py_True : Py_False;
        out = exemplars < 0 ? Py_BuildValue("(OOOOOOO)", c->keys, first, ts, val, hist, c->meta, one)
                            : Py_BuildValue("(OOOOOOOL)", c->keys, first, ts, val, hist, c->meta, one, exemplars);
    }
    Py_XDECREF(first);
    Py_XDECREF(ts);
    Py_XDECREF(val);
    Py_XDECREF(hist);
    return out;
}

/* What a failed walk answers: None (Python's turn), a ValueError, or the Python error set. */
static PyObject *no_answer(Ctx *c) {
    if (c->state == PYTHON) Py_RETURN_NONE;
    if (c->msg[0]) PyErr_SetString(PyExc_ValueError, c->msg);
    return NULL; /* else: a Python error (memory) is already set */
}

static void release(Ctx *c) {
    Py_XDECREF(c->keys);
    Py_XDECREF(c->meta);
    PyMem_Free(c->first.p);
    PyMem_Free(c->ts.p);
    PyMem_Free(c->val.p);
    PyMem_Free(c->hist.p);
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    Py_buffer view;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.buf = view.buf;
    c.end = view.len;
    c.keys = PyList_New(0);
    c.meta = PyList_New(0);
    if (c.keys && c.meta) out = walk(&c) == 0 ? answer(&c, -1) : no_answer(&c);
    release(&c);
    PyBuffer_Release(&view);
    return out;
}

/* ---- remote write 2.0: io.prometheus.write.v2.Request (wire_v2.py is the reference) ----
 *
 * scan_v2(raw) -> None | (keys, first, ts_ms, values, histograms, metadata, single, exemplars)
 * The columns as scan's, each key the series' labels in 1.0's encoding (wire.encode_labels'
 * bytes, in the order sent), metadata (the value of the series' __name__, MetricType) for
 * series whose type is set, exemplars the count received. ValueError: malformed (the messages
 * say what, as wire_v2's do, not always at the same offset). None: wire_v2's Python decoder
 * reads the body: unpacked or several runs of label references, a varint of 2**64 or more. */

static int64_t vlen(int64_t v) {
    int64_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_v(uint8_t *p, int64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

typedef struct {
    Vec off, len; /* the symbols: offsets and lengths in the body */
    Vec refs;     /* one series' references (scratch) */
    int64_t exemplars;
} V2;

static int v2_series(Ctx *c, V2 *v, int64_t pos, int64_t stop) {
    const uint8_t *buf = c->buf;
    int64_t n, refs_a = 0, refs_b = 0, runs = 0, hist = 0;
    uint64_t t, kind = 0, x;
    int over;
    while (pos < stop) {
        if (buf[pos] == 0x12) { /* sample */
            pos = length(c, pos + 1, &n);
            if (pos < 0) return -1;
            if (pos + n > stop) return (int)fail(c, "sample at offset %lld runs past its series", pos, 0);
            if (sample(c, pos, pos + n)) return -1;
            pos += n;
            continue;
        }
        pos = varint(c, pos, &t, &over);
        if (pos < 0) return -1;
        if (over) return (int)to_python(c);
        if (t == 0x0A) { /* labels_refs, packed */
            pos = length(c, pos, &n);
            if (pos < 0) return -1;
            if (pos + n > stop) return (int)fail(c, "label references at offset %lld run past their series", pos, 0);
            refs_a = pos;
            refs_b = pos + n;
            runs++;
            pos += n;
        } else if (t == 0x08) {
            return (int)to_python(c); /* an unpacked reference */
        } else if (t == 0x2A) { /* metadata: its type */
            pos = length(c, pos, &n);
            if (pos < 0) return -1;
            int64_t mstop = pos + n;
            kind = 0;
            while (pos < mstop) {
                pos = varint(c, pos, &t, &over);
                if (pos < 0) return -1;
                if (over) return (int)to_python(c);
                if (t == 0x08) {
                    pos = varint(c, pos, &x, &over);
                    if (pos < 0) return -1;
                    if (over) return (int)to_python(c);
                    kind = x;
                } else {
                    pos = skip(c, pos, (int)(t & 7));
                    if (pos < 0) return -1;
                }
            }
            if (pos != mstop) return (int)fail(c, "metadata ending at offset %lld is malformed", mstop, 0);
        } else {
            if (t == 0x1A) hist++;        /* native histogram: counted */
            if (t == 0x22) v->exemplars++; /* exemplar: counted */
            pos = skip(c, pos, (int)(t & 7));
            if (pos < 0) return -1;
        }
    }
    if (pos != stop) return (int)fail(c, "timeseries ending at offset %lld is malformed", stop, 0);
    if (runs > 1) return (int)to_python(c);
    v->refs.n = 0;
    for (int64_t p = refs_a; p < refs_b;) {
        p = varint(c, p, &x, &over);
        if (p < 0) return -1;
        if (over) return (int)to_python(c);
        if (p > refs_b) return (int)fail(c, "truncated varint at offset %lld", p, 0);
        if (x >= (uint64_t)v->off.n)
            return (int)fail(c, "label reference %lld is past the symbols table (%lld symbols)", (long long)x,
                             v->off.n);
        if (push(c, &v->refs, (int64_t)x)) return -1;
    }
    if (v->refs.n % 2)
        return (int)fail(c, "a series has %lld label references (name, value pairs: an even count)", v->refs.n, 0);
    int64_t size = 0, name = -1;
    for (Py_ssize_t i = 0; i < v->refs.n; i += 2) {
        int64_t ln = v->len.p[v->refs.p[i]], lv = v->len.p[v->refs.p[i + 1]];
        int64_t inner = 1 + vlen(ln) + ln + 1 + vlen(lv) + lv;
        size += 1 + vlen(inner) + inner;
        if (name < 0 && ln == 8 && memcmp(buf + v->off.p[v->refs.p[i]], "__name__", 8) == 0) name = v->refs.p[i + 1];
    }
    PyObject *key = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!key) goto py_error;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(key);
    for (Py_ssize_t i = 0; i < v->refs.n; i += 2) {
        int64_t a = v->refs.p[i], b = v->refs.p[i + 1];
        int64_t ln = v->len.p[a], lv = v->len.p[b];
        *out++ = 0x0A;
        out = put_v(out, 1 + vlen(ln) + ln + 1 + vlen(lv) + lv);
        *out++ = 0x0A;
        out = put_v(out, ln);
        memcpy(out, buf + v->off.p[a], (size_t)ln);
        out += ln;
        *out++ = 0x12;
        out = put_v(out, lv);
        memcpy(out, buf + v->off.p[b], (size_t)lv);
        out += lv;
    }
    if (PyList_Append(c->keys, key)) {
        Py_DECREF(key);
        goto py_error;
    }
    Py_DECREF(key);
    if (kind != 0 && name >= 0) {
        PyObject *item = Py_BuildValue("(y#K)", (const char *)buf + v->off.p[name], (Py_ssize_t)v->len.p[name],
                                       (unsigned long long)kind);
        if (!item || PyList_Append(c->meta, item)) {
            Py_XDECREF(item);
            goto py_error;
        }
        Py_DECREF(item);
    }
    if (push(c, &c->hist, hist)) return -1;
    return push(c, &c->first, c->ts.n);
py_error:
    c->state = FAIL;
    c->msg[0] = 0;
    return -1;
}

static int walk_v2(Ctx *c, V2 *v) {
    const int64_t end = c->end;
    int64_t pos = 0, n;
    uint64_t tag;
    int over;
    Vec spans = {0};
    int rc = -1;
    if (push(c, &c->first, 0)) goto out;
    while (pos < end) {
        pos = varint(c, pos, &tag, &over);
        if (pos < 0) goto out;
        if (over) {
            to_python(c);
            goto out;
        }
        if (tag == 0x22 || tag == 0x2A) { /* a symbol (field 4) or a series (field 5) */
            pos = length(c, pos, &n);
            if (pos < 0) goto out;
            if (pos + n > end) {
                fail(c, tag == 0x22 ? "symbol at offset %lld runs past the end of the body"
                                    : "timeseries at offset %lld runs past the end of the body", pos, 0);
                goto out;
            }
            if (tag == 0x22 ? (push(c, &v->off, pos) || push(c, &v->len, n))
                            : (push(c, &spans, pos) || push(c, &spans, pos + n)))
                goto out;
            pos += n;
        } else if ((tag == 0x0A || tag == 0x12 || tag == 0x1A) && v->off.n == 0 && spans.n == 0) {
            fail(c, "this is a remote write 1.0 body (prometheus.WriteRequest) sent as 2.0; "
                    "send it with Content-Type application/x-protobuf", 0, 0);
            goto out;
        } else {
            pos = skip(c, pos, (int)(tag & 7));
            if (pos < 0) goto out;
        }
    }
    if (pos != end) {
        fail(c, "protobuf body ends inside a field", 0, 0);
        goto out;
    }
    for (Py_ssize_t i = 0; i < spans.n; i += 2)
        if (v2_series(c, v, spans.p[i], spans.p[i + 1])) goto out;
    rc = 0;
out:
    PyMem_Free(spans.p);
    return rc;
}

static PyObject *scan_v2(PyObject *self, PyObject *arg) {
    Py_buffer view;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    V2 v;
    memset(&v, 0, sizeof v);
    c.buf = view.buf;
    c.end = view.len;
    c.keys = PyList_New(0);
    c.meta = PyList_New(0);
    if (c.keys && c.meta) out = walk_v2(&c, &v) == 0 ? answer(&c, (long long)v.exemplars) : no_answer(&c);
    release(&c);
    PyMem_Free(v.off.p);
    PyMem_Free(v.len.p);
    PyMem_Free(v.refs.p);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(raw) -> None | (keys, first, ts_ms, values, histograms, metadata, single): see the module's source"},
    {"scan_v2", scan_v2, METH_O,
     "scan_v2(raw) -> None | (keys, first, ts_ms, values, histograms, metadata, single, exemplars): remote "
     "write 2.0, see the module's source"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_c",
                                    "The remote-write decoder's optional C pass (wire.py falls back to Python).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__decode_c(void) { return PyModule_Create(&module); }
