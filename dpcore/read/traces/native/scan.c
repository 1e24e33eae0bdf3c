/* The native scan of a Chrome trace's traceEvents array: dpcore's own code, for
 * dpcore.read.traces.bytescan (see dpcore/read/traces/native/__init__.py for why).
 *
 * One call walks the whole events of buf[pos:len) (a window of the decompressed file, which
 * starts where the previous window's last whole event ended) and, for each complete ('X')
 * event, writes ts/dur as doubles, the integer args (correlation, stream, ...) as int64 and, for
 * the text/id values, the id of their raw text among the distinct ones seen so far (kept in a
 * dp_state across calls; absent values are the empty text). Python decodes each distinct raw
 * text once. Anything this code does not expect (escaped keys, a "ph"
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

enum { N_EVENT_KEYS = sizeof EVENT_KEYS / sizeof EVENT_KEYS[0], N_ARG_KEYS = sizeof ARG_KEYS / sizeof ARG_KEYS[0] };

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static int64_t skip_ws(const uint8_t *b, int64_t i, int64_t n) {
    while (i < n && is_ws(b[i])) i++;
    return i;
}

/* End (just after the closing quote) of the string whose opening quote is at i; -1 if it does
 * not end before n. A quote ends it unless an odd run of backslashes comes before it. */
static int64_t string_end(const uint8_t *b, int64_t i, int64_t n) {
    int64_t from = i + 1;
    i = from;
    for (int64_t stop = from + 16 < n ? from + 16 : n; i < stop; i++) { /* most strings are short */
        if (b[i] == '\\') break;
        if (b[i] == '"') return i + 1;
    }
    while (i < n) {
        const uint8_t *q = memchr(b + i, '"', (size_t)(n - i));
        if (!q) return -1;
        int64_t j = q - b, k = j;
        while (k > from && b[k - 1] == '\\') k--;
        if (((j - k) & 1) == 0) return j + 1;
        i = j + 1; /* an escaped quote */
    }
    return -1;
}

/* End of the value that starts at i (no whitespace before it): -1 if it does not end before n
 * (or its end cannot be told yet), -2 for a byte no value starts with. A scalar ends at the
 * next ',', '}', ']' or whitespace; an object/array at its matching bracket. */
static int64_t value_end(const uint8_t *b, int64_t i, int64_t n) {
    uint8_t c = b[i];
    if (c == '"') return string_end(b, i, n);
    if (c == '{' || c == '[') {
        int64_t depth = 0;
        while (i < n) {
            c = b[i];
            if (c == '"') {
                i = string_end(b, i, n);
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
    /* Fast path (Clinger): at most 15 digits (an exact double) and a power of ten of at most
     * 22 (exact too): one multiplication or division, correctly rounded, is the value. */
    static const double P10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int64_t i = s, digits = 0, scale = 0;
    uint64_t m = 0;
    int neg = i < e && b[i] == '-';
    if (neg) i++;
    for (; i < e && b[i] >= '0' && b[i] <= '9'; i++, digits++) m = m * 10 + (uint64_t)(b[i] - '0');
    if (i < e && b[i] == '.')
        for (i++; i < e && b[i] >= '0' && b[i] <= '9'; i++, digits++, scale--) m = m * 10 + (uint64_t)(b[i] - '0');
    if (i == e && digits <= 15 && scale >= -22) {
        double v = scale ? (double)m / P10[-scale] : (double)m;
        *out = neg ? -v : v;
        return 1;
    }
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

/* The slot of key b[s:e) among keys (-1: not ours); -2 when the key has an escape. Our keys
 * have none, so only a key that is none of them is searched for a backslash. */
static int key_slot(const uint8_t *b, int64_t s, int64_t e, const dp_key *keys, int nk) {
    for (int k = 0; k < nk; k++)
        if (keys[k].len == e - s && b[s] == (uint8_t)keys[k].key[0] && !memcmp(b + s, keys[k].key, (size_t)keys[k].len))
            return keys[k].slot;
    return memchr(b + s, '\\', (size_t)(e - s)) ? -2 : -1;
}

/* The members of the object whose '{' is at i: values of known keys go to vs/ve by slot; an
 * object value of the key of slot S_ARGS is walked here too, its members' values to as/ae by
 * ARG_KEYS (when as is not NULL: one pass over the args). Returns the index after its '}', -1
 * if it does not end before n, -2 if odd. */
static int64_t members(const uint8_t *b, int64_t i, int64_t n, const dp_key *keys, int nk,
                       int64_t *vs, int64_t *ve, int64_t *as, int64_t *ae) {
    i = skip_ws(b, i + 1, n);
    if (i >= n) return -1;
    if (b[i] == '}') return i + 1;
    for (;;) {
        if (b[i] != '"') return -2;
        int64_t ke = string_end(b, i, n);
        if (ke < 0) return -1;
        int slot = key_slot(b, i + 1, ke - 1, keys, nk);
        if (slot == -2) return -2;
        i = skip_ws(b, ke, n);
        if (i >= n) return -1;
        if (b[i] != ':') return -2;
        i = skip_ws(b, i + 1, n);
        if (i >= n) return -1;
        if (slot >= 0 && ve[slot] >= 0) return -2; /* a duplicate key: a JSON parser keeps the last one */
        int64_t e = slot == S_ARGS && as && b[i] == '{'
                        ? members(b, i, n, ARG_KEYS, N_ARG_KEYS, as, ae, NULL, NULL)
                        : value_end(b, i, n);
        if (e < 0) return e;
        if (slot >= 0) {
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

/* The distinct raw texts of one text field, in order of first appearance: an open-addressing
 * table of (hash, id) over an arena of their bytes. Absent values are the empty text. */
typedef struct {
    uint64_t *hash;  /* per slot; 0: empty */
    int32_t *slot_id;
    int64_t cap;     /* slots, a power of two */
    int64_t count;
    int64_t *off;    /* per id: start in arena; off[count] is the arena's used size */
    int64_t off_cap;
    uint8_t *arena;
    int64_t arena_cap;
    int64_t last;    /* 1 + the id interned last (0: none): consecutive events repeat a text */
    int64_t empty;   /* 1 + the id of the empty text (0: not seen): most events lack most args */
} dp_field;

typedef struct {
    dp_field f[N_TEXT];
} dp_state;

void dp_free(dp_state *st) {
    if (!st) return;
    for (int k = 0; k < N_TEXT; k++) {
        free(st->f[k].hash);
        free(st->f[k].slot_id);
        free(st->f[k].off);
        free(st->f[k].arena);
    }
    free(st);
}

dp_state *dp_new(void) {
    dp_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    for (int k = 0; k < N_TEXT; k++) {
        dp_field *f = &st->f[k];
        f->cap = 1024;
        f->hash = calloc((size_t)f->cap, sizeof *f->hash);
        f->slot_id = calloc((size_t)f->cap, sizeof *f->slot_id);
        f->off_cap = 1024;
        f->off = calloc((size_t)f->off_cap, sizeof *f->off);
        f->arena_cap = 1 << 16;
        f->arena = malloc((size_t)f->arena_cap);
        if (!f->hash || !f->slot_id || !f->off || !f->arena) {
            dp_free(st);
            return NULL;
        }
    }
    return st;
}

/* The raw text of id in field k: its bytes (and *len), or NULL for an id not seen. */
const uint8_t *dp_raw(const dp_state *st, int k, int64_t id, int64_t *len) {
    if (!st || k < 0 || k >= N_TEXT || id < 0 || id >= st->f[k].count) return NULL;
    *len = st->f[k].off[id + 1] - st->f[k].off[id];
    return st->f[k].arena + st->f[k].off[id];
}

int64_t dp_count(const dp_state *st, int k) { return st && k >= 0 && k < N_TEXT ? st->f[k].count : -1; }

static uint64_t hash_bytes(const uint8_t *p, int64_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n, w;
    while (n >= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h | 1; /* never 0: 0 marks an empty slot */
}

static int64_t intern_hashed(dp_field *f, const uint8_t *p, int64_t n);

/* The id of the text p[0:n) in field f, added if new; -1 when memory runs out. */
static int64_t intern(dp_field *f, const uint8_t *p, int64_t n) {
    if (!n && f->empty) return f->empty - 1;
    if (f->last) {
        int64_t id = f->last - 1;
        if (f->off[id + 1] - f->off[id] == n && !memcmp(f->arena + f->off[id], p, (size_t)n)) return id;
    }
    int64_t id = intern_hashed(f, p, n);
    if (id >= 0) {
        f->last = id + 1;
        if (!n) f->empty = id + 1;
    }
    return id;
}

/* intern without the shortcuts: the id of p[0:n) from the hash table, added if new. */
static int64_t intern_hashed(dp_field *f, const uint8_t *p, int64_t n) {
    uint64_t h = hash_bytes(p, n);
    int64_t mask = f->cap - 1, at = (int64_t)(h & (uint64_t)mask);
    while (f->hash[at]) {
        if (f->hash[at] == h) {
            int64_t id = f->slot_id[at], len = f->off[id + 1] - f->off[id];
            if (len == n && !memcmp(f->arena + f->off[id], p, (size_t)n)) return id;
        }
        at = (at + 1) & mask;
    }
    if (f->count + 2 > f->off_cap) {
        int64_t *off = realloc(f->off, (size_t)(2 * f->off_cap) * sizeof *off);
        if (!off) return -1;
        f->off = off;
        f->off_cap *= 2;
    }
    int64_t used = f->off[f->count];
    if (used + n > f->arena_cap) {
        int64_t cap = f->arena_cap;
        while (used + n > cap) cap *= 2;
        uint8_t *arena = realloc(f->arena, (size_t)cap);
        if (!arena) return -1;
        f->arena = arena;
        f->arena_cap = cap;
    }
    if (n) memcpy(f->arena + used, p, (size_t)n);
    int64_t id = f->count++;
    f->off[f->count] = used + n;
    f->hash[at] = h;
    f->slot_id[at] = (int32_t)id;
    if (2 * f->count > f->cap) { /* keep the table at most half full */
        int64_t cap = 2 * f->cap;
        uint64_t *hash = calloc((size_t)cap, sizeof *hash);
        int32_t *ids = calloc((size_t)cap, sizeof *ids);
        if (!hash || !ids) {
            free(hash);
            free(ids);
            return -1;
        }
        for (int64_t j = 0; j < f->cap; j++) {
            if (!f->hash[j]) continue;
            int64_t to = (int64_t)(f->hash[j] & (uint64_t)(cap - 1));
            while (hash[to]) to = (to + 1) & (cap - 1);
            hash[to] = f->hash[j];
            ids[to] = f->slot_id[j];
        }
        free(f->hash);
        free(f->slot_id);
        f->hash = hash;
        f->slot_id = ids;
        f->cap = cap;
    }
    return id;
}

/* Scan the events of buf[pos:n). first: pos is just after the array's '['; otherwise just after
 * a whole event. out[0]: where the next call starts (after the last whole event; -1 if none)
 * or, with DP_DONE, the index of the array's ']'; out[1]: entries of the array passed; out[2]:
 * 'X' events written (rows 0..out[2]-1 of the outputs, each output a field-major array of cap
 * rows; texts: ids among the field's distinct raw texts in st, see dp_raw). DP_FULL: cap rows
 * written, call again from out[0]. */
int dp_scan(dp_state *st, const uint8_t *b, int64_t n, int64_t pos, int first, int64_t cap, double *times,
            int64_t *ints, int32_t *texts, int64_t *out) {
    int64_t i = pos, last = -1, entries = 0, nx = 0;
    int status = DP_MORE;
    if (!st) return DP_ODD;
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
        int64_t end = members(b, i, n, EVENT_KEYS, N_EVENT_KEYS, vs, ve, as, ae);
        if (end == -2) return DP_ODD;
        if (end < 0) break;
        entries++;
        /* 'X': "ph" is the string "X" (a "ph" with escapes is decoded by the numpy path) */
        int64_t ps = vs[S_PH], pe = ve[S_PH];
        int is_x = pe - ps == 3 && b[ps] == '"' && b[ps + 1] == 'X' && b[ps + 2] == '"';
        if (!is_x && pe >= 0 && b[ps] == '"' && memchr(b + ps, '\\', (size_t)(pe - ps))) return DP_ODD;
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
            int64_t id = intern(&st->f[k], b + s, e >= 0 ? e - s : 0);
            if (id < 0) return DP_ODD;
            texts[k * cap + nx] = (int32_t)id;
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
