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
    if (!c.keys || !c.meta) goto done;
    if (walk(&c) == 0) {
        int single = c.ts.n == c.hist.n; /* as many samples as series, and one each: */
        for (Py_ssize_t i = 0; single && i < c.hist.n; i++)
            single = c.hist.p[i] == 0 && c.first.p[i + 1] == i + 1;
        PyObject *first = column(&c.first), *ts = column(&c.ts), *val = column(&c.val), *hist = column(&c.hist);
        if (first && ts && val && hist)
            out = Py_BuildValue("(OOOOOOO)", c.keys, first, ts, val, hist, c.meta, single ? Py_True : Py_False);
        Py_XDECREF(first);
        Py_XDECREF(ts);
        Py_XDECREF(val);
        Py_XDECREF(hist);
    } else if (c.state == PYTHON) {
        out = Py_None;
        Py_INCREF(out);
    } else if (c.msg[0]) {
        PyErr_SetString(PyExc_ValueError, c.msg);
    } /* else: a Python error (memory) is already set */
done:
    Py_XDECREF(c.keys);
    Py_XDECREF(c.meta);
    PyMem_Free(c.first.p);
    PyMem_Free(c.ts.p);
    PyMem_Free(c.val.p);
    PyMem_Free(c.hist.p);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(raw) -> None | (keys, first, ts_ms, values, histograms, metadata, single): see the module's source"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_c",
                                    "The remote-write decoder's optional C pass (wire.py falls back to Python).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__decode_c(void) { return PyModule_Create(&module); }
