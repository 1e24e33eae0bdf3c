/* The native scan of a Chrome trace's traceEvents array: dpcore's own code, for
 * dpcore.read.traces.bytescan (see dpcore/read/traces/native/__init__.py for why).
 *
 * One call walks the whole events of buf[pos:len) (a window of the decompressed file, which
 * starts where the previous window's last whole event ended) and, for each complete ('X')
 * event, writes ts/dur as doubles, the integer args (correlation, stream, ...) as int64 and the
 * byte spans [start, end) of the text/id values (end -1: absent). The spans are decoded later,
 * in Python, once per distinct span. Anything this code does not expect (escaped keys, a "ph"
 * with escapes, duplicate keys, entries that are not objects, a number it cannot convert
 * exactly as Python's float()/int() would) returns DP_ODD, and the caller reads the file the
 * numpy way. Every read is bounds-checked against len; nesting is counted, never recursed.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DP_MORE = 0, DP_DONE = 1, DP_FULL = 2, DP_ODD = 3 };
enum { N_TIME = 2, N_INT = 5, N_TEXT = 8 };
/* slots: 0..1 times (ts, dur), 2..6 ints, 7..14 texts, 15 ph, 16 args */
enum { S_TIME = 0, S_INT = 2, S_TEXT = 7, S_PH = 15, S_ARGS = 16, N_SLOT = 17 };

typedef struct {
    const char *key;
    int len;
    int slot;
} dp_key;

static const dp_key EVENT_KEYS[] = {
    {"ph", 2, S_PH}, {"ts", 2, S_TIME}, {"dur", 3, S_TIME + 1}, {"name", 4, S_TEXT},
    {"cat", 3, S_TEXT + 1}, {"pid", 3, S_TEXT + 2}, {"tid", 3, S_TEXT + 3}, {"args", 4, S_ARGS},
};
/* in the order of bytescan.FIELDS after the X fields: corr, stream, coll, in_nelems, out_nelems,
 * dtype, group_size, in_dims, in_types */
static const dp_key ARG_KEYS[] = {
    {"correlation", 11, S_INT}, {"stream", 6, S_INT + 1}, {"Collective name", 15, S_TEXT + 4},
    {"In msg nelems", 13, S_INT + 2}, {"Out msg nelems", 14, S_INT + 3}, {"dtype", 5, S_TEXT + 5},
    {"Group size", 10, S_INT + 4}, {"Input Dims", 10, S_TEXT + 6}, {"Input type", 10, S_TEXT + 7},
};

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static int64_t skip_ws(const uint8_t *b, int64_t i, int64_t n) {
    while (i < n && is_ws(b[i])) i++;
    return i;
}

/* End (just after the closing quote) of the string whose opening quote is at i; -1 if it does
 * not end before n. *esc is set when it holds a backslash. */
static int64_t string_end(const uint8_t *b, int64_t i, int64_t n, int *esc) {
    i++;
    while (i < n) {
        const uint8_t *q = memchr(b + i, '"', (size_t)(n - i));
        if (!q) return -1;
        int64_t j = q - b;
        const uint8_t *s = memchr(b + i, '\\', (size_t)(j - i));
        if (!s) return j + 1;
        *esc = 1;
        i = (s - b) + 2; /* the escaped byte is skipped, whatever it is */
    }
    return -1;
}

/* End of the value that starts at i (no whitespace before it): -1 if it does not end before n
 * (or its end cannot be told yet), -2 for a byte no value starts with. A scalar ends at the
 * next ',', '}', ']' or whitespace; an object/array at its matching bracket. */
static int64_t value_end(const uint8_t *b, int64_t i, int64_t n) {
    uint8_t c = b[i];
    if (c == '"') {
        int esc = 0;
        return string_end(b, i, n, &esc);
    }
    if (c == '{' || c == '[') {
        int64_t depth = 0;
        while (i < n) {
            c = b[i];
            if (c == '"') {
                int esc = 0;
                i = string_end(b, i, n, &esc);
                if (i < 0) return -1;
                continue;
            }
            if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0) return i + 1;
            }
            i++;
        }
        return -1;
    }
    if (c == ',' || c == '}' || c == ']' || c == ':' || is_ws(c)) return -2;
    while (i < n) {
        c = b[i];
        if (c == ',' || c == '}' || c == ']' || is_ws(c)) return i;
        if (c == '"' || c == '{' || c == '[' || c == ':') return -2;
        i++;
    }
    return -1;
}

/* Whether [s, e) is a JSON number; *integral when it has no fraction or exponent. */
static int is_number(const uint8_t *b, int64_t s, int64_t e, int *integral) {
    int64_t i = s;
    if (i < e && b[i] == '-') i++;
    if (i >= e) return 0;
    if (b[i] == '0') i++;
    else if (b[i] >= '1' && b[i] <= '9') {
        while (i < e && b[i] >= '0' && b[i] <= '9') i++;
    } else return 0;
    *integral = 1;
    if (i < e && b[i] == '.') {
        *integral = 0;
        i++;
        if (i >= e || b[i] < '0' || b[i] > '9') return 0;
        while (i < e && b[i] >= '0' && b[i] <= '9') i++;
    }
    if (i < e && (b[i] == 'e' || b[i] == 'E')) {
        *integral = 0;
        i++;
        if (i < e && (b[i] == '+' || b[i] == '-')) i++;
        if (i >= e || b[i] < '0' || b[i] > '9') return 0;
        while (i < e && b[i] >= '0' && b[i] <= '9') i++;
    }
    return i == e;
}

/* The correctly rounded double of the number [s, e) (strtod on a bounded, NUL-terminated
 * copy: the same value as Python's float() of the text); 0 if it cannot be read whole. */
static int to_double(const uint8_t *b, int64_t s, int64_t e, double *out) {
    char tmp[80];
    if (e - s >= (int64_t)sizeof tmp) return 0;
    memcpy(tmp, b + s, (size_t)(e - s));
    tmp[e - s] = 0;
    char *end = NULL;
    *out = strtod(tmp, &end);
    return end == tmp + (e - s);
}

/* ts/dur: float() of the value; absent 0.0. 0 (odd) for anything but a finite JSON number. */
static int as_time(const uint8_t *b, int64_t s, int64_t e, double *out) {
    int integral = 0;
    if (e < 0) {
        *out = 0.0;
        return 1;
    }
    if (!is_number(b, s, e, &integral) || !to_double(b, s, e, out) || !isfinite(*out)) return 0;
    if (integral && *out == 0.0) *out = 0.0; /* "-0" is the integer 0: float(0) is +0.0 */
    return 1;
}

/* correlation/stream/...: int() of the value if it fits int64, else -1; absent -1. 0 (odd)
 * for strings (int() parses them). */
static int as_id(const uint8_t *b, int64_t s, int64_t e, int64_t *out) {
    int integral = 0;
    *out = -1;
    if (e < 0) return 1;
    uint8_t c = b[s];
    if (c == '{' || c == '[') return 1;
    if (e - s == 4 && !memcmp(b + s, "null", 4)) return 1;
    if (e - s == 4 && !memcmp(b + s, "true", 4)) {
        *out = 1;
        return 1;
    }
    if (e - s == 5 && !memcmp(b + s, "false", 5)) {
        *out = 0;
        return 1;
    }
    if (!is_number(b, s, e, &integral)) return 0;
    if (integral) { /* no leading zeros in JSON: more than 19 digits is out of int64 */
        int64_t i = s, neg = b[s] == '-';
        uint64_t v = 0;
        if (neg) i++;
        if (e - i > 19 || (e - i == 19 && memcmp(b + i, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0))
            return 1;
        for (; i < e; i++) v = v * 10 + (uint64_t)(b[i] - '0');
        *out = neg ? (int64_t)(0 - v) : (int64_t)v;
        return 1;
    }
    double d;
    if (!to_double(b, s, e, &d)) return 0;
    if (!isfinite(d)) return 1; /* int(inf) raises: -1 */
    d = trunc(d);
    if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) *out = (int64_t)d;
    return 1;
}

/* The slot of key b[s:e) among keys (-1: not ours); -2 when the key has an escape. */
static int key_slot(const uint8_t *b, int64_t s, int64_t e, int esc, const dp_key *keys, int nk) {
    if (esc) return -2;
    for (int k = 0; k < nk; k++)
        if (keys[k].len == e - s && !memcmp(b + s, keys[k].key, (size_t)keys[k].len)) return keys[k].slot;
    return -1;
}

/* The members of the object whose '{' is at i: values of known keys go to vs/ve by slot. Returns
 * the index after its '}', -1 if it does not end before n, -2 if odd. */
static int64_t members(const uint8_t *b, int64_t i, int64_t n, const dp_key *keys, int nk,
                       int64_t *vs, int64_t *ve) {
    i = skip_ws(b, i + 1, n);
    if (i >= n) return -1;
    if (b[i] == '}') return i + 1;
    for (;;) {
        if (b[i] != '"') return -2;
        int esc = 0;
        int64_t ke = string_end(b, i, n, &esc);
        if (ke < 0) return -1;
        int slot = key_slot(b, i + 1, ke - 1, esc, keys, nk);
        if (slot == -2) return -2;
        i = skip_ws(b, ke, n);
        if (i >= n) return -1;
        if (b[i] != ':') return -2;
        i = skip_ws(b, i + 1, n);
        if (i >= n) return -1;
        int64_t e = value_end(b, i, n);
        if (e < 0) return e;
        if (slot >= 0) {
            if (ve[slot] >= 0) return -2; /* a duplicate key: a JSON parser keeps the last one */
            vs[slot] = i;
            ve[slot] = e;
        }
        i = skip_ws(b, e, n);
        if (i >= n) return -1;
        if (b[i] == '}') return i + 1;
        if (b[i] != ',') return -2;
        i = skip_ws(b, i + 1, n);
        if (i >= n) return -1;
    }
}

/* Scan the events of buf[pos:n). first: pos is just after the array's '['; otherwise just after
 * a whole event. out[0]: where the next call starts (after the last whole event; -1 if none)
 * or, with DP_DONE, the index of the array's ']'; out[1]: entries of the array passed; out[2]:
 * 'X' events written (rows 0..out[2]-1 of the outputs, each output a field-major array of cap
 * rows). DP_FULL: cap rows written, call again from out[0]. */
int dp_scan(const uint8_t *b, int64_t n, int64_t pos, int first, int64_t cap, double *times,
            int64_t *ints, int64_t *tstart, int64_t *tend, int64_t *out) {
    int64_t i = pos, last = -1, entries = 0, nx = 0;
    int status = DP_MORE;
    out[0] = -1;
    out[1] = out[2] = 0;
    if (first) {
        i = skip_ws(b, i, n);
        if (i < n && b[i] == ']') {
            out[0] = i;
            return DP_DONE;
        }
    }
    for (;;) {
        if (!first) { /* after an entry: ',' then the next one, or ']' */
            i = skip_ws(b, i, n);
            if (i >= n) break;
            if (b[i] == ']') {
                last = i;
                status = DP_DONE;
                break;
            }
            if (b[i] != ',') return DP_ODD;
            i = skip_ws(b, i + 1, n);
            if (i >= n) break;
        }
        first = 0;
        if (i >= n) break;
        if (b[i] != '{') return DP_ODD; /* an entry that is not an object (or a trailing comma) */
        int64_t vs[N_SLOT], ve[N_SLOT], as[N_SLOT], ae[N_SLOT];
        for (int k = 0; k < N_SLOT; k++) ve[k] = ae[k] = -1, vs[k] = as[k] = 0;
        int64_t end = members(b, i, n, EVENT_KEYS, 8, vs, ve);
        if (end == -2) return DP_ODD;
        if (end < 0) break;
        entries++;
        /* 'X': "ph" is the string "X" (a "ph" with escapes is decoded by the numpy path) */
        int64_t ps = vs[S_PH], pe = ve[S_PH];
        int is_x = pe - ps == 3 && b[ps] == '"' && b[ps + 1] == 'X' && b[ps + 2] == '"';
        if (!is_x && pe >= 0 && b[ps] == '"' && memchr(b + ps, '\\', (size_t)(pe - ps))) return DP_ODD;
        if (ve[S_ARGS] >= 0 && b[vs[S_ARGS]] == '{') {
            if (members(b, vs[S_ARGS], n, ARG_KEYS, 9, as, ae) < 0) return DP_ODD;
        }
        i = end;
        last = end;
        if (!is_x) continue;
        for (int k = 0; k < N_TIME; k++)
            if (!as_time(b, vs[S_TIME + k], ve[S_TIME + k], &times[k * cap + nx])) return DP_ODD;
        for (int k = 0; k < N_INT; k++)
            if (!as_id(b, as[S_INT + k], ae[S_INT + k], &ints[k * cap + nx])) return DP_ODD;
        for (int k = 0; k < N_TEXT; k++) {
            int slot = S_TEXT + k;
            int64_t s = k < 4 ? vs[slot] : as[slot], e = k < 4 ? ve[slot] : ae[slot];
            tstart[k * cap + nx] = e >= 0 ? s : 0;
            tend[k * cap + nx] = e;
        }
        if (++nx == cap) {
            status = DP_FULL;
            break;
        }
    }
    out[0] = last;
    out[1] = entries;
    out[2] = nx;
    return status;
}
