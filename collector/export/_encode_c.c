/* The remote-write body of stored columnar rows in one C pass (optional: encode.py's numpy
 * path is the fallback and the reference, and tests check the two byte for byte).
 *
 * Why: in a running collector the numpy encoder made ~15 array passes per sample (gathers,
 * repeats, scatters) and was half the export's CPU; written out directly, a sample is one read
 * of its value and 18 bytes stored.
 *
 * encode(vals, ncols, rows, order, bounds, ts_ms, labels) -> (body, samples)
 *   vals    float64 C-contiguous buffer, (nrows, ncols): a stored batch's values by field
 *   rows    int64[nf]: the vals row of each exported field, in export order
 *   order   int64[n]: the vals column of each sorted row (by series, then time)
 *   bounds  int64[ng + 1]: each series group's (GPU, job) rows in order[]
 *   ts_ms   int64[n]: each sorted row's timestamp in ms
 *   labels  a list of ng lists of nf bytes: each (group, field) series' encoded label fields
 * Each non-empty (group, field) series is a TimeSeries field (tag 1, length, labels, Sample
 * fields); NaN (not available) is skipped, an empty series left out. Bytes as
 * gpufleet.collector.remote_write.wire encodes them (varints of negative timestamps included).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

static inline char *put_double(char *p, double v) {
#if PY_LITTLE_ENDIAN
    memcpy(p, &v, 8);
#else
    unsigned char b[8];
    memcpy(b, &v, 8);
    for (int k = 0; k < 8; k++) p[k] = (char)b[7 - k];
#endif
    return p + 8;
}

typedef struct {
    Py_buffer vals, rows, order, bounds, ts;
} Bufs;

static void release(Bufs *b) {
    Py_buffer *all[] = {&b->vals, &b->rows, &b->order, &b->bounds, &b->ts};
    for (int k = 0; k < 5; k++)
        if (all[k]->obj) PyBuffer_Release(all[k]);
}

static int get(PyObject *o, Py_buffer *view, Py_ssize_t item, const char *what) {
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len % item) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", what, view->len, item);
        return -1;
    }
    return 0;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *vals_o, *rows_o, *order_o, *bounds_o, *ts_o, *labels;
    Py_ssize_t ncols;
    Bufs b;
    char *tails = NULL;  /* per sorted row: [length, 0x10, varint...] */
    memset(&b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OnOOOOO!", &vals_o, &ncols, &rows_o, &order_o, &bounds_o, &ts_o, &PyList_Type,
                          &labels))
        return NULL;
    if (get(vals_o, &b.vals, 8, "vals") || get(rows_o, &b.rows, 8, "rows") || get(order_o, &b.order, 8, "order") ||
        get(bounds_o, &b.bounds, 8, "bounds") || get(ts_o, &b.ts, 8, "ts_ms"))
        goto fail;
    const double *vals = b.vals.buf;
    const int64_t *rows = b.rows.buf, *order = b.order.buf, *bounds = b.bounds.buf, *ts = b.ts.buf;
    Py_ssize_t nvals = b.vals.len / 8, nf = b.rows.len / 8, n = b.order.len / 8, nb = b.bounds.len / 8;
    Py_ssize_t ng = nb - 1;
    if (ncols <= 0 || nvals % ncols || b.ts.len / 8 != n || ng < 0 || PyList_GET_SIZE(labels) != ng) {
        PyErr_SetString(PyExc_ValueError, "encode: inconsistent shapes");
        goto fail;
    }
    Py_ssize_t nrows = nvals / ncols;
    for (Py_ssize_t f = 0; f < nf; f++)
        if (rows[f] < 0 || rows[f] >= nrows) {
            PyErr_SetString(PyExc_IndexError, "encode: a field row out of range");
            goto fail;
        }
    for (Py_ssize_t i = 0; i < n; i++)
        if (order[i] < 0 || order[i] >= ncols) {
            PyErr_SetString(PyExc_IndexError, "encode: an order index out of range");
            goto fail;
        }
    if (ng >= 0 && (bounds[0] < 0 || bounds[ng] > n)) {
        PyErr_SetString(PyExc_IndexError, "encode: bounds out of range");
        goto fail;
    }
    for (Py_ssize_t g = 0; g < ng; g++)
        if (bounds[g + 1] < bounds[g]) {
            PyErr_SetString(PyExc_ValueError, "encode: bounds not ascending");
            goto fail;
        }
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *row = PyList_GET_ITEM(labels, g);
        if (!PyList_Check(row) || PyList_GET_SIZE(row) != nf) {
            PyErr_SetString(PyExc_ValueError, "encode: labels must be one list of a label set per field per group");
            goto fail;
        }
        for (Py_ssize_t f = 0; f < nf; f++)
            if (!PyBytes_Check(PyList_GET_ITEM(row, f))) {
                PyErr_SetString(PyExc_TypeError, "encode: labels must be bytes");
                goto fail;
            }
    }

    /* Each row's Sample tail once (tag 0x10 and the timestamp's varint, 2-11 bytes), not once
     * per field: a sample is then a fixed 3-byte head, its double and this copy. */
    tails = PyMem_Malloc(n ? n * 12 : 1);
    if (!tails) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char *t = tails + 12 * i;
        t[1] = 0x10;
        t[0] = (char)(put_varint(t + 2, (uint64_t)ts[i]) - (t + 1));
    }

    /* Pass 1: each series' size, so the body is allocated once at its exact size. A sample is
     * tag + length + (tag, double) + (tag, varint): 12 + the timestamp varint's bytes. */
    Py_ssize_t total = 0, samples = 0;
    for (Py_ssize_t g = 0; g < ng; g++) {
        for (Py_ssize_t f = 0; f < nf; f++) {
            const double *v = vals + rows[f] * ncols;
            Py_ssize_t body = 0, c = 0;
            for (Py_ssize_t i = bounds[g]; i < bounds[g + 1]; i++)
                if (v[order[i]] == v[order[i]]) {
                    body += 11 + tails[12 * i];
                    c++;
                }
            if (!c) continue;
            body += PyBytes_GET_SIZE(PyList_GET_ITEM(PyList_GET_ITEM(labels, g), f));
            total += 1 + varint_len((uint64_t)body) + body;
            samples += c;
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) goto fail;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t g = 0; g < ng; g++) {
        for (Py_ssize_t f = 0; f < nf; f++) {
            const double *v = vals + rows[f] * ncols;
            Py_ssize_t body = 0;
            for (Py_ssize_t i = bounds[g]; i < bounds[g + 1]; i++)
                if (v[order[i]] == v[order[i]]) body += 11 + tails[12 * i];
            if (!body) continue;
            PyObject *lab = PyList_GET_ITEM(PyList_GET_ITEM(labels, g), f);
            Py_ssize_t ll = PyBytes_GET_SIZE(lab);
            body += ll;
            *p++ = 0x0a;
            p = put_varint(p, (uint64_t)body);
            memcpy(p, PyBytes_AS_STRING(lab), ll);
            p += ll;
            for (Py_ssize_t i = bounds[g]; i < bounds[g + 1]; i++) {
                double x = v[order[i]];
                if (x != x) continue;
                const char *t = tails + 12 * i;
                *p++ = 0x12;
                *p++ = (char)(9 + t[0]);
                *p++ = 0x09;
                p = put_double(p, x);
                memcpy(p, t + 1, (size_t)t[0]);
                p += t[0];
            }
        }
    }
    PyMem_Free(tails);
    release(&b);
    return Py_BuildValue("(Nn)", out, samples);
fail:
    PyMem_Free(tails);
    release(&b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS,
     "encode(vals, ncols, rows, order, bounds, ts_ms, labels) -> (body, samples): see the module's source"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode_c",
                                    "The remote-write encoder's optional C pass (encode.py falls back to numpy).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__encode_c(void) { return PyModule_Create(&module); }
