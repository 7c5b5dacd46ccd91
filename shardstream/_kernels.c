/* shardstream._kernels: the hot loops of a shuffled message's build in C, with the GIL released.
 *
 * Each has a pure-numpy twin that gives the same result bit for bit and is used wherever this
 * module is not built (shardstream/kernels.py says which runs; tests/test_kernels.py compares them):
 *
 *   feistel_walk  the keyed permutation's cycle walk (shardstream/order/permutation.py): every
 *                 position of a shuffled epoch goes through it, 6 rounds of splitmix64 a walk step
 *   gather_rows   out[i] = row row[i] of row group group[i], fixed-width rows
 *                 (server/read/gather.py): the copy of every shuffled message
 *   locate_rows   each stored row's row group, shard and place in both (order/read_order.py)
 *   unique_groups np.unique(return_inverse=True) of a message's row groups (server/read/reader.py)
 *
 * No numpy C API: arguments are buffers (the buffer protocol), so building needs only a C compiler
 * and Python's headers. Bounds are checked here as well as by the callers: a wrong index raises
 * IndexError, never reads outside a row group.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUNDS 16

static inline uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* One pass of the Feistel network over x[0:count], in place, a block of elements at a time with
 * their halves in two arrays: every round is then one loop over independent elements, which the
 * compiler vectorizes (8 lanes with AVX-512's 64-bit multiply: ~2.3x the same rounds one element
 * at a time, measured). GCC on x86-64 compiles it for three targets and picks one at load time. */
#define BLOCK 256
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default")))
#endif
static void feistel_pass(uint64_t *x, Py_ssize_t count, int half, const uint64_t *keys, int rounds,
                         int decrypt) {
    const uint64_t mask = (1ULL << half) - 1; /* half <= 31: checked by feistel_walk */
    uint64_t left[BLOCK], right[BLOCK];
    for (Py_ssize_t at = 0; at < count; at += BLOCK) {
        Py_ssize_t m = count - at < BLOCK ? count - at : BLOCK;
        for (Py_ssize_t i = 0; i < m; i++) {
            left[i] = x[at + i] >> half;
            right[i] = x[at + i] & mask;
        }
        if (!decrypt) {
            for (int k = 0; k < rounds; k++) {
                const uint64_t key = keys[k];
                for (Py_ssize_t i = 0; i < m; i++) {
                    uint64_t t = left[i] ^ (mix(right[i] ^ key) & mask);
                    left[i] = right[i];
                    right[i] = t;
                }
            }
        } else {
            for (int k = rounds - 1; k >= 0; k--) {
                const uint64_t key = keys[k];
                for (Py_ssize_t i = 0; i < m; i++) {
                    uint64_t t = right[i] ^ (mix(left[i] ^ key) & mask);
                    right[i] = left[i];
                    left[i] = t;
                }
            }
        }
        for (Py_ssize_t i = 0; i < m; i++)
            x[at + i] = (left[i] << half) | right[i];
    }
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (itemsize > 1 && view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", name,
                     view->len, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release_buffers(Py_buffer *views, int n) {
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

/* The buffers of objs[0:n], C-contiguous, of whole items of itemsizes[i] bytes, writable from index
 * `first_out` on: 0, or -1 with an exception set and none held. */
static int get_buffers(PyObject *const *objs, Py_buffer *views, int n, int first_out, const Py_ssize_t *itemsizes,
                       const char *const *names) {
    for (int i = 0; i < n; i++)
        if (get_buffer(objs[i], &views[i], i >= first_out, itemsizes[i], names[i]) < 0) {
            release_buffers(views, i);
            return -1;
        }
    return 0;
}

PyDoc_STRVAR(feistel_walk_doc,
"feistel_walk(src, dst, n, half, keys, decrypt)\n--\n\n"
"dst[i] = the keyed permutation of [0, n) at src[i] (its inverse if decrypt): a Feistel network of\n"
"2*half bits with the round keys in `keys` (uint64 each), applied again while the result is >= n.\n"
"src and dst are buffers of int64 of one length (they may be the same); every src[i] must lie in\n"
"[0, n), else IndexError.");

static PyObject *feistel_walk(PyObject *self, PyObject *args) {
    PyObject *objs[3]; /* src, keys, dst */
    unsigned long long n;
    int half, decrypt;
    if (!PyArg_ParseTuple(args, "OOKiOp", &objs[0], &objs[2], &n, &half, &objs[1], &decrypt))
        return NULL;
    if (half < 1 || half > 31 || n > (1ULL << (2 * half))) {
        PyErr_Format(PyExc_ValueError, "feistel_walk: half %d does not cover n %llu", half, n);
        return NULL;
    }
    static const char *const names[3] = {"src", "keys", "dst"};
    static const Py_ssize_t sizes[3] = {8, 8, 8};
    Py_buffer b[3];
    if (get_buffers(objs, b, 3, 2, sizes, names) < 0)
        return NULL;
    Py_buffer src = b[0], keys = b[1], dst = b[2];
    PyObject *result = NULL;
    Py_ssize_t count = src.len / 8;
    int rounds = (int)(keys.len / 8);
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "feistel_walk: src has %zd items, dst %zd", count, dst.len / 8);
        goto done;
    }
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        PyErr_Format(PyExc_ValueError, "feistel_walk: %d round keys (1 to %d)", rounds, MAX_ROUNDS);
        goto done;
    }
    uint64_t key[MAX_ROUNDS];
    memcpy(key, keys.buf, (size_t)rounds * 8);
    const int64_t *in = (const int64_t *)src.buf;
    uint64_t *out = (uint64_t *)dst.buf;
    Py_ssize_t bad = -1, *todo = NULL;
    uint64_t *walk = NULL;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        if (in[i] < 0 || (uint64_t)in[i] >= n) {
            bad = i;
            break;
        }
    }
    if (bad < 0) {
        memmove(out, in, (size_t)count * 8);
        feistel_pass(out, count, half, key, rounds, decrypt);
        /* the cycle walk: the results that left [0, n) go through again, all together each time */
        Py_ssize_t m = 0;
        for (Py_ssize_t i = 0; i < count; i++)
            m += out[i] >= n;
        if (m) {
            todo = malloc((size_t)m * sizeof *todo);
            walk = malloc((size_t)m * sizeof *walk);
            if (!todo || !walk) {
                nomem = 1;
            } else {
                m = 0;
                for (Py_ssize_t i = 0; i < count; i++)
                    if (out[i] >= n) {
                        todo[m] = i;
                        walk[m++] = out[i];
                    }
                while (m) {
                    feistel_pass(walk, m, half, key, rounds, decrypt);
                    Py_ssize_t left = 0;
                    for (Py_ssize_t j = 0; j < m; j++) {
                        if (walk[j] >= n) {
                            todo[left] = todo[j];
                            walk[left++] = walk[j];
                        } else {
                            out[todo[j]] = walk[j];
                        }
                    }
                    m = left;
                }
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(todo);
    free(walk);
    if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "positions must lie in [0, %llu): item %zd is %lld", n, bad,
                     (long long)in[bad]);
    else if (nomem)
        PyErr_NoMemory();
    else
        result = Py_NewRef(Py_None);
done:
    release_buffers(b, 3);
    return result;
}

#define PREFETCH_BYTES 8192     /* gather_rows: bytes of rows asked for ahead of the copy */
#define PREFETCH_ROW_BYTES 4096 /* ... of each row at most */

PyDoc_STRVAR(gather_rows_doc,
"gather_rows(out, width, addresses, lengths, group, row)\n--\n\n"
"Copies row row[i] of row group group[i] to out[i * width : (i + 1) * width] for every i. Row group\n"
"g's rows lie at addresses[g], lengths[g] rows of `width` bytes, and must stay alive for the call.\n"
"addresses, lengths, group and row are buffers of int64; out is writable, len(group) * width bytes.\n"
"A group or row out of range raises IndexError (out may then be partly written).");

static PyObject *gather_rows(PyObject *self, PyObject *args) {
    PyObject *objs[5]; /* addresses, lengths, group, row, out */
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnOOOO", &objs[4], &width, &objs[0], &objs[1], &objs[2], &objs[3]))
        return NULL;
    if (width < 1) {
        PyErr_Format(PyExc_ValueError, "gather_rows: width must be >= 1, got %zd", width);
        return NULL;
    }
    static const char *const names[5] = {"addresses", "lengths", "group", "row", "out"};
    static const Py_ssize_t sizes[5] = {8, 8, 8, 8, 1};
    Py_buffer bufs[5];
    if (get_buffers(objs, bufs, 5, 4, sizes, names) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t groups = bufs[0].len / 8, n = bufs[2].len / 8;
    if (bufs[1].len != bufs[0].len || bufs[3].len != bufs[2].len) {
        PyErr_SetString(PyExc_ValueError, "gather_rows: addresses/lengths or group/row differ in length");
        goto done;
    }
    if (n > PY_SSIZE_T_MAX / width || bufs[4].len != n * width) {
        PyErr_Format(PyExc_ValueError, "gather_rows: out has %zd bytes, %zd rows of %zd need %zd",
                     bufs[4].len, n, width, n * width);
        goto done;
    }
    char *out = (char *)bufs[4].buf;
    const int64_t *addr = (const int64_t *)bufs[0].buf, *len = (const int64_t *)bufs[1].buf;
    const int64_t *group = (const int64_t *)bufs[2].buf, *row = (const int64_t *)bufs[3].buf;
    Py_ssize_t bad = -1;
    /* Each row's every cache line (up to PREFETCH_ROW_BYTES; the CPU's own prefetcher follows a longer
     * row), asked for rows enough ahead to keep ~PREFETCH_BYTES in flight: a row's first line alone,
     * 4 rows ahead, left a 1,032 B row's other 16 lines to miss one after another: the copy of a 2 MiB
     * message of random rows out of 256 MiB took 1.8x as long (loadtest/README.md, "Ninth pass"). */
    const Py_ssize_t lines = width < PREFETCH_ROW_BYTES ? width : PREFETCH_ROW_BYTES;
    Py_ssize_t ahead = PREFETCH_BYTES / width;
    ahead = ahead < 4 ? 4 : ahead > 32 ? 32 : ahead;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t g = group[i], r = row[i];
        if (g < 0 || g >= groups || r < 0 || r >= len[g]) {
            bad = i;
            break;
        }
        if (i + ahead < n) { /* rows of a shuffled message lie anywhere: ask for one a few rows ahead */
            int64_t ga = group[i + ahead], ra = row[i + ahead];
            if (ga >= 0 && ga < groups && ra >= 0 && ra < len[ga]) {
                const char *p = (const char *)(intptr_t)addr[ga] + ra * width;
                for (Py_ssize_t at = 0; at < lines; at += 64)
                    __builtin_prefetch(p + at);
            }
        }
        memcpy(out + i * width, (const char *)(intptr_t)addr[g] + r * width, (size_t)width);
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "gather_rows: item %zd asks for row %lld of row group %lld", bad,
                     (long long)row[bad], (long long)group[bad]);
    else
        result = Py_NewRef(Py_None);
done:
    release_buffers(bufs, 5);
    return result;
}

PyDoc_STRVAR(locate_rows_doc,
"locate_rows(stored, starts, step, group_shard, shard_starts, group, shard, row_in_shard, row_in_group)\n--\n\n"
"For each stored row index v: its row group g (the last of `starts` <= v: v // step where the row\n"
"groups are of one size, step > 0, else a binary search), g's shard, v's row in that shard and in g.\n"
"starts: int64, the row groups' first rows and the end (len groups + 1); group_shard: int32;\n"
"shard_starts: int64. Out: group int64, shard int32, row_in_shard and row_in_group int64, each as long\n"
"as stored. A row outside [starts[0], starts[-1]) raises IndexError.");

static Py_ssize_t upper_bound(const int64_t *a, Py_ssize_t n, int64_t v) { /* first i with a[i] > v */
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static PyObject *locate_rows(PyObject *self, PyObject *args) {
    PyObject *objs[8];
    long long step;
    if (!PyArg_ParseTuple(args, "OOLOOOOOO", &objs[0], &objs[1], &step, &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &objs[7]))
        return NULL;
    static const char *const names[8] = {"stored", "starts", "group_shard", "shard_starts",
                                   "group", "shard", "row_in_shard", "row_in_group"};
    static const Py_ssize_t sizes[8] = {8, 8, 4, 8, 8, 4, 8, 8};
    Py_buffer b[8];
    if (get_buffers(objs, b, 8, 4, sizes, names) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = b[0].len / 8, nstarts = b[1].len / 8, groups = nstarts - 1, shards = b[3].len / 8;
    if (groups < 1 || b[2].len / 4 != groups) {
        PyErr_SetString(PyExc_ValueError, "locate_rows: starts needs one entry per row group and the end");
        goto done;
    }
    for (int i = 4; i < 8; i++)
        if (b[i].len / sizes[i] != n) {
            PyErr_Format(PyExc_ValueError, "locate_rows: %s has %zd items, stored %zd", names[i],
                         b[i].len / sizes[i], n);
            goto done;
        }
    const int64_t *v = b[0].buf, *starts = b[1].buf, *shard_starts = b[3].buf;
    const int32_t *group_shard = b[2].buf;
    int64_t *g_out = b[4].buf, *ris = b[6].buf, *rig = b[7].buf;
    int32_t *s_out = b[5].buf;
    const int64_t first = starts[0], end = starts[groups];
    Py_ssize_t bad = -1;
    int bad_shard = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = v[i];
        if (r < first || r >= end) {
            bad = i;
            break;
        }
        Py_ssize_t g;
        if (step > 0) {
            g = (Py_ssize_t)((r - first) / step);
            if (g > groups - 1)
                g = groups - 1;
        } else {
            g = upper_bound(starts, nstarts, r) - 1;
        }
        int32_t s = group_shard[g];
        if (s < 0 || s >= shards) {
            bad = i, bad_shard = 1;
            break;
        }
        g_out[i] = g;
        s_out[i] = s;
        ris[i] = r - shard_starts[s];
        rig[i] = r - starts[g];
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0 && bad_shard)
        PyErr_Format(PyExc_ValueError, "locate_rows: a row group's shard is not in shard_starts");
    else if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "locate_rows: row %lld is outside [%lld, %lld)", (long long)v[bad],
                     (long long)first, (long long)end);
    else
        result = Py_NewRef(Py_None);
done:
    release_buffers(b, 8);
    return result;
}

PyDoc_STRVAR(unique_groups_doc,
"unique_groups(group, groups, unique, inverse) -> count\n--\n\n"
"np.unique(group, return_inverse=True) for values in [0, groups): the distinct values, ascending, go\n"
"to unique[:count] and each value's index among them to inverse. group, unique and inverse are int64\n"
"(unique at least as long as the values, inverse as long). A value outside [0, groups) raises IndexError.");

static PyObject *unique_groups(PyObject *self, PyObject *args) {
    PyObject *objs[3]; /* group, unique, inverse */
    Py_ssize_t groups;
    if (!PyArg_ParseTuple(args, "OnOO", &objs[0], &groups, &objs[1], &objs[2]))
        return NULL;
    static const char *const names[3] = {"group", "unique", "inverse"};
    static const Py_ssize_t sizes[3] = {8, 8, 8};
    Py_buffer b[3];
    if (get_buffers(objs, b, 3, 1, sizes, names) < 0)
        return NULL;
    Py_buffer g = b[0], u = b[1], inv = b[2];
    PyObject *result = NULL;
    Py_ssize_t n = g.len / 8, count = 0, bad = -1;
    if (groups < 0 || inv.len != g.len || u.len < g.len) {
        PyErr_SetString(PyExc_ValueError, "unique_groups: unique and inverse must be as long as group");
        goto done;
    }
    int64_t *slot = malloc((size_t)(groups ? groups : 1) * sizeof *slot);
    if (!slot) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *in = g.buf;
    int64_t *uniq = u.buf, *out = inv.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < groups; k++)
        slot[k] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (in[i] < 0 || in[i] >= groups) {
            bad = i;
            break;
        }
        slot[in[i]] = 0;
    }
    if (bad < 0) {
        for (Py_ssize_t k = 0; k < groups; k++)
            if (slot[k] == 0) {
                slot[k] = count;
                uniq[count++] = k;
            }
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = slot[in[i]];
    }
    Py_END_ALLOW_THREADS
    free(slot);
    if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "unique_groups: value %lld is outside [0, %zd)", (long long)in[bad], groups);
    else
        result = PyLong_FromSsize_t(count);
done:
    release_buffers(b, 3);
    return result;
}

static PyMethodDef methods[] = {
    {"feistel_walk", feistel_walk, METH_VARARGS, feistel_walk_doc},
    {"gather_rows", gather_rows, METH_VARARGS, gather_rows_doc},
    {"locate_rows", locate_rows, METH_VARARGS, locate_rows_doc},
    {"unique_groups", unique_groups, METH_VARARGS, unique_groups_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "shardstream._kernels",
    "The data plane's hot loops in C (see shardstream/kernels.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
