/* The bench sink's sample count: a Prometheus remote-write 1.0 WriteRequest (uncompressed)
 * walked field by field, every length checked against its parent, the samples of every
 * TimeSeries counted. Compiled on first use by export_cost.py (cc -O2 -shared) and called
 * through ctypes; where no compiler is, the sink decodes with wire.decode instead (~100x the
 * CPU, which the bench then reports as the sink's).
 *
 * long rw_count(const unsigned char *p, long n) -> samples, or -1 when malformed. */
#include <stdint.h>

static int varint(const unsigned char **pp, const unsigned char *end, uint64_t *out) {
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end) return -1;
        unsigned char b = *p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Skip one field's value of wire type wt; -1 when it overruns end or the type is unknown. */
static int skip(const unsigned char **pp, const unsigned char *end, int wt) {
    uint64_t v;
    switch (wt) {
    case 0: return varint(pp, end, &v);
    case 1: if (end - *pp < 8) return -1; *pp += 8; return 0;
    case 2: if (varint(pp, end, &v) || v > (uint64_t)(end - *pp)) return -1; *pp += v; return 0;
    case 5: if (end - *pp < 4) return -1; *pp += 4; return 0;
    default: return -1;
    }
}

/* A Sample: value (1, fixed64) and timestamp (2, varint); other fields skipped. */
static int sample(const unsigned char *p, const unsigned char *end) {
    uint64_t key, v;
    while (p < end) {
        if (varint(&p, end, &key)) return -1;
        int f = (int)(key >> 3), wt = (int)(key & 7);
        if (f == 1 && wt == 1) { if (end - p < 8) return -1; p += 8; }
        else if (f == 2 && wt == 0) { if (varint(&p, end, &v)) return -1; }
        else if (f == 1 || f == 2 || skip(&p, end, wt)) return -1;
    }
    return 0;
}

/* A Label: name (1) and value (2), both length-delimited. */
static int label(const unsigned char *p, const unsigned char *end) {
    uint64_t key;
    while (p < end) {
        if (varint(&p, end, &key)) return -1;
        if (((key >> 3) == 1 || (key >> 3) == 2) && (key & 7) != 2) return -1;
        if (skip(&p, end, (int)(key & 7))) return -1;
    }
    return 0;
}

static long series(const unsigned char *p, const unsigned char *end) {
    uint64_t key, len;
    long n = 0;
    while (p < end) {
        if (varint(&p, end, &key)) return -1;
        int f = (int)(key >> 3), wt = (int)(key & 7);
        if ((f == 1 || f == 2) && wt == 2) {
            if (varint(&p, end, &len) || len > (uint64_t)(end - p)) return -1;
            if (f == 1 ? label(p, p + len) : sample(p, p + len)) return -1;
            n += f == 2;
            p += len;
        } else if (f == 1 || f == 2 || skip(&p, end, wt)) return -1;
    }
    return n;
}

long rw_count(const unsigned char *p, long n) {
    const unsigned char *end = p + n;
    uint64_t key, len;
    long total = 0;
    while (p < end) {
        if (varint(&p, end, &key)) return -1;
        if (key == 0x0A) {  /* timeseries = 1, length-delimited */
            if (varint(&p, end, &len) || len > (uint64_t)(end - p)) return -1;
            long s = series(p, p + len);
            if (s < 0) return -1;
            total += s;
            p += len;
        } else if ((key >> 3) == 1 || skip(&p, end, (int)(key & 7))) return -1;
    }
    return total;
}
