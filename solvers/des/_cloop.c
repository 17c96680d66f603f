/* The plain event loop of fleetopt's simulator, compiled (fleetopt.solvers.des._cloop).

   run(station, state, times, order, horizon_s) -> (last_at, events) does exactly what
   fleetopt.solvers.des.engine._plain_loop does for a run whose replicas are all plain, whose dispatch is
   JoinShortestQueue, whose heap is empty at the start (no cap changes) and whose profiles have no activity power
   (nothing metered): the same events in the same order, and the same floating-point operations in the same order
   on IEEE doubles, so the records and integrals are the same bit for bit (tests/test_des_compiled.py runs every
   regression case through both). The Python loop is the reference; engine.py calls this one only where those
   conditions hold and the module was built (an optional extension: without a C compiler the package installs
   without it and the Python loop runs).

   The state stays the station's: it is read from its lists and memoryviews at the start and written back at the
   end (the per-request columns are written in place through their buffers), so the station's finish hooks and
   records see what the Python loop would have left. Built with -ffp-contract=off: a fused multiply-add would round
   differently from Python's separate multiply and add. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double at; int64_t seq; int64_t r; } Event;

typedef struct { int64_t *a; Py_ssize_t n, cap; } IntHeap;     /* one replica's sequence keys */
typedef struct { int64_t *a; Py_ssize_t head, n, cap; } Fifo;   /* one replica's waiting requests */
typedef struct { Event *a; Py_ssize_t n, cap; } EventHeap;

static int grow(void **p, Py_ssize_t *cap, size_t size) {
    Py_ssize_t c = *cap ? 2 * *cap : 16;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q; *cap = c;
    return 0;
}

/* Binary min-heaps, as heapq's: a replica's sequence keys (int64) and the run's events, ordered by (instant, sequence
   number). Distinct keys pop in one order whatever the layout, so the events come in the Python loop's order. */
#define INT_LESS(x, y) ((x) < (y))
#define EVENT_LESS(x, y) ((x).at < (y).at || ((x).at == (y).at && (x).seq < (y).seq))
#define DEFINE_HEAP(NAME, HEAP, T, LESS)                                                                   \
    static int NAME##_push(HEAP *h, T v) {                                                                 \
        if (h->n == h->cap && grow((void **)&h->a, &h->cap, sizeof(T))) return -1;                         \
        Py_ssize_t k = h->n++;                                                                              \
        while (k > 0) {                                                                                     \
            Py_ssize_t p = (k - 1) >> 1;                                                                    \
            if (!LESS(v, h->a[p])) break;                                                                   \
            h->a[k] = h->a[p];                                                                              \
            k = p;                                                                                          \
        }                                                                                                   \
        h->a[k] = v;                                                                                        \
        return 0;                                                                                           \
    }                                                                                                       \
    static T NAME##_pop(HEAP *h) {                                                                         \
        T top = h->a[0], last = h->a[--h->n];                                                               \
        Py_ssize_t k = 0, n = h->n;                                                                         \
        while (1) {                                                                                         \
            Py_ssize_t c = 2 * k + 1;                                                                       \
            if (c >= n) break;                                                                              \
            if (c + 1 < n && LESS(h->a[c + 1], h->a[c])) c++;                                               \
            if (!LESS(h->a[c], last)) break;                                                                \
            h->a[k] = h->a[c];                                                                              \
            k = c;                                                                                          \
        }                                                                                                   \
        if (n) h->a[k] = last;                                                                              \
        return top;                                                                                         \
    }

DEFINE_HEAP(iheap, IntHeap, int64_t, INT_LESS)
DEFINE_HEAP(eheap, EventHeap, Event, EVENT_LESS)

static int fifo_push(Fifo *q, int64_t v) {
    if (q->n == q->cap) {
        Py_ssize_t c = q->cap ? 2 * q->cap : 16;
        int64_t *a = malloc((size_t)c * sizeof(int64_t));
        if (!a) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < q->n; k++) a[k] = q->a[(q->head + k) % q->cap];
        free(q->a);
        q->a = a; q->cap = c; q->head = 0;
    }
    q->a[(q->head + q->n) % q->cap] = v;
    q->n++;
    return 0;
}

static int64_t fifo_pop(Fifo *q) {
    int64_t v = q->a[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    return v;
}

/* ---- reading and writing the station's state ---- */

typedef struct { Py_buffer view; char kind; } Column;   /* kind: 'd' float64, 'q' int64, 'i' int32 */

static int column(PyObject *owner, const char *name, Column *c, int writable) {
    PyObject *o = PyObject_GetAttrString(owner, name);
    if (!o) return -1;
    int rc = PyObject_GetBuffer(o, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0));
    Py_DECREF(o);
    if (rc) return -1;
    const char *f = c->view.format ? c->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if ((*f == 'd' && c->view.itemsize == 8)) c->kind = 'd';
    else if ((*f == 'q' || *f == 'l') && c->view.itemsize == 8) c->kind = 'q';
    else if ((*f == 'i' || *f == 'l') && c->view.itemsize == 4) c->kind = 'i';
    else {
        PyErr_Format(PyExc_TypeError, "_cloop: column %s has format %s", name, c->view.format);
        PyBuffer_Release(&c->view);
        c->view.obj = NULL;
        return -1;
    }
    return 0;
}

static inline int64_t int_at(const Column *c, int64_t i) {
    return c->kind == 'q' ? ((const int64_t *)c->view.buf)[i] : (int64_t)((const int32_t *)c->view.buf)[i];
}

static int read_list(PyObject *owner, const char *name, PyObject **list, Py_ssize_t n) {
    *list = PyObject_GetAttrString(owner, name);
    if (!*list) return -1;
    if (!PyList_Check(*list) || PyList_GET_SIZE(*list) != n) {
        PyErr_Format(PyExc_TypeError, "_cloop: %s is not a list of %zd", name, n);
        return -1;
    }
    return 0;
}

/* A list of Python numbers read into a C array, and a C array written back into that list, item by item. */
#define DEFINE_LIST_IO(READ, WRITE, T, AS_C, FROM_C)                                                      \
    static int READ(PyObject *owner, const char *name, T *out, Py_ssize_t n) {                             \
        PyObject *l;                                                                                        \
        if (read_list(owner, name, &l, n)) { Py_XDECREF(l); return -1; }                                    \
        for (Py_ssize_t k = 0; k < n; k++) {                                                                \
            out[k] = AS_C(PyList_GET_ITEM(l, k));                                                           \
            if (out[k] == (T)-1 && PyErr_Occurred()) { Py_DECREF(l); return -1; }                           \
        }                                                                                                   \
        Py_DECREF(l);                                                                                       \
        return 0;                                                                                           \
    }                                                                                                       \
    static int WRITE(PyObject *owner, const char *name, const T *v, Py_ssize_t n) {                        \
        PyObject *l = PyObject_GetAttrString(owner, name);                                                  \
        if (!l) return -1;                                                                                  \
        for (Py_ssize_t k = 0; k < n; k++) {                                                                \
            PyObject *x = FROM_C(v[k]);                                                                     \
            if (!x || PyList_SetItem(l, k, x)) { Py_DECREF(l); return -1; }                                 \
        }                                                                                                   \
        Py_DECREF(l);                                                                                       \
        return 0;                                                                                           \
    }

DEFINE_LIST_IO(doubles, put_doubles, double, PyFloat_AsDouble, PyFloat_FromDouble)
DEFINE_LIST_IO(ints, put_ints, int64_t, PyLong_AsLongLong, PyLong_FromLongLong)

/* ---- the loop ---- */

typedef struct { const Column *kch, *lout; const double *alpha, *beta; double *start, *first; } Requests;

/* Request i joins a replica's batch at its anchor b, iteration it (the Python loop's admit): its start, and its
   first prefill chunk's key (or, without a prompt, its first token now and its completion's key) on the replica's
   heap; the batch's growth per iteration gr and its compute f0, f1 take the request's terms. */
static inline int admit(const Requests *q, IntHeap *sq, int64_t i, double b, int64_t it, int64_t ch, double gdr,
                        int64_t M, int64_t *gr, double *f0, double *f1) {
    q->start[i] = b;
    int64_t k = int_at(q->kch, i);
    if (k) {
        *gr += ch;
        *f0 += q->alpha[i];
        *f1 += q->beta[i];
        return iheap_push(sq, (it + k) * M + 4 * i);
    }
    q->first[i] = b;
    *gr += 1;
    *f0 += gdr;
    return iheap_push(sq, (it + int_at(q->lout, i)) * M + 4 * i + 1);
}


typedef struct {
    Py_ssize_t R, P;
    int64_t *it, *c0, *g, *token, *run, *cap, *outstanding, *chunk, *replica_pool, *in_system, *span_lo, *span_hi;
    double *ref, *d0, *d1, *W, *h, *gd, *batch_last, *batch_area, *energy, *system_last, *system_area;
    double **power;
    IntHeap *seqs;
    Fifo *waiting;
} Replicas;

static void free_replicas(Replicas *s) {
    void *blocks[] = {s->it, s->c0, s->g, s->token, s->run, s->cap, s->outstanding, s->chunk, s->replica_pool,
                      s->in_system, s->span_lo, s->span_hi, s->ref, s->d0, s->d1, s->W, s->h, s->gd,
                      s->batch_last, s->batch_area, s->energy, s->system_last, s->system_area};
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) free(blocks[k]);
    if (s->power) for (Py_ssize_t r = 0; r < s->R; r++) free(s->power[r]);
    free(s->power);
    if (s->seqs) for (Py_ssize_t r = 0; r < s->R; r++) free(s->seqs[r].a);
    free(s->seqs);
    if (s->waiting) for (Py_ssize_t r = 0; r < s->R; r++) free(s->waiting[r].a);
    free(s->waiting);
}

static int load(PyObject *s, PyObject *st, Replicas *x) {
    PyObject *W = PyObject_GetAttrString(s, "W"), *ranges = PyObject_GetAttrString(st, "ranges");
    if (!W || !ranges) { Py_XDECREF(W); Py_XDECREF(ranges); return -1; }
    x->R = PyList_Size(W);
    x->P = PySequence_Size(ranges);
    Py_DECREF(W);
    Py_ssize_t R = x->R, P = x->P;
    int64_t **iR[] = {&x->it, &x->c0, &x->g, &x->token, &x->run, &x->cap, &x->outstanding, &x->chunk,
                      &x->replica_pool};
    double **dR[] = {&x->ref, &x->d0, &x->d1, &x->W, &x->h, &x->gd, &x->batch_last, &x->batch_area, &x->energy};
    for (size_t k = 0; k < sizeof iR / sizeof iR[0]; k++) *iR[k] = calloc((size_t)R + 1, sizeof(int64_t));
    for (size_t k = 0; k < sizeof dR / sizeof dR[0]; k++) *dR[k] = calloc((size_t)R + 1, sizeof(double));
    x->in_system = calloc((size_t)P + 1, sizeof(int64_t));
    x->span_lo = calloc((size_t)P + 1, sizeof(int64_t));
    x->span_hi = calloc((size_t)P + 1, sizeof(int64_t));
    x->system_last = calloc((size_t)P + 1, sizeof(double));
    x->system_area = calloc((size_t)P + 1, sizeof(double));
    x->power = calloc((size_t)R + 1, sizeof(double *));
    x->seqs = calloc((size_t)R + 1, sizeof(IntHeap));
    x->waiting = calloc((size_t)R + 1, sizeof(Fifo));
    for (size_t k = 0; k < sizeof iR / sizeof iR[0]; k++) if (!*iR[k]) goto nomem;
    for (size_t k = 0; k < sizeof dR / sizeof dR[0]; k++) if (!*dR[k]) goto nomem;
    if (!x->in_system || !x->span_lo || !x->span_hi || !x->system_last || !x->system_area || !x->power ||
        !x->seqs || !x->waiting) goto nomem;
    for (Py_ssize_t p = 0; p < P; p++) {
        PyObject *rg = PySequence_GetItem(ranges, p);
        if (!rg) goto fail;
        PyObject *a = PyObject_GetAttrString(rg, "start"), *b = PyObject_GetAttrString(rg, "stop");
        Py_DECREF(rg);
        if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); goto fail; }
        x->span_lo[p] = PyLong_AsLongLong(a);
        x->span_hi[p] = PyLong_AsLongLong(b);
        Py_DECREF(a); Py_DECREF(b);
    }
    Py_CLEAR(ranges);
    if (ints(s, "it", x->it, R) || ints(s, "c0", x->c0, R) || ints(s, "g", x->g, R) || ints(s, "token", x->token, R)
        || ints(s, "run", x->run, R) || ints(s, "cap", x->cap, R) || ints(s, "outstanding", x->outstanding, R)
        || ints(s, "chunk", x->chunk, R) || ints(s, "replica_pool", x->replica_pool, R)
        || doubles(s, "ref", x->ref, R) || doubles(s, "d0", x->d0, R) || doubles(s, "d1", x->d1, R)
        || doubles(s, "W", x->W, R) || doubles(s, "h", x->h, R) || doubles(s, "gd", x->gd, R)
        || doubles(st, "batch_last", x->batch_last, R) || doubles(st, "batch_area", x->batch_area, R)
        || doubles(st, "energy", x->energy, R) || ints(st, "in_system", x->in_system, P)
        || doubles(st, "system_last", x->system_last, P) || doubles(st, "system_area", x->system_area, P))
        return -1;
    PyObject *power = PyObject_GetAttrString(st, "power"), *seqs = PyObject_GetAttrString(s, "seqs"),
             *waiting = PyObject_GetAttrString(s, "waiting");
    int bad = !power || !seqs || !waiting;
    for (Py_ssize_t r = 0; !bad && r < R; r++) {
        PyObject *row = PySequence_GetItem(power, r);
        PyObject *tab = row ? PySequence_Fast(row, "_cloop: a power table is not a sequence") : NULL;
        Py_XDECREF(row);
        if (!tab) { bad = 1; break; }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(tab);
        x->power[r] = malloc(((size_t)n + 1) * sizeof(double));
        if (!x->power[r]) { Py_DECREF(tab); PyErr_NoMemory(); bad = 1; break; }
        for (Py_ssize_t k = 0; k < n; k++) x->power[r][k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(tab, k));
        Py_DECREF(tab);
        if (PyErr_Occurred()) { bad = 1; break; }
        PyObject *sq = PyList_GetItem(seqs, r);
        if (!sq) { bad = 1; break; }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(sq); k++) {   /* a valid heapq heap stays one, copied as is */
            IntHeap *hp = &x->seqs[r];
            if (hp->n == hp->cap && grow((void **)&hp->a, &hp->cap, sizeof(int64_t))) { bad = 1; break; }
            hp->a[hp->n++] = PyLong_AsLongLong(PyList_GET_ITEM(sq, k));
        }
        PyObject *q = PyList_GetItem(waiting, r);
        PyObject *itq = q ? PyObject_GetIter(q) : NULL;
        if (!itq) { bad = 1; break; }
        PyObject *v;
        while (!bad && (v = PyIter_Next(itq))) {
            if (fifo_push(&x->waiting[r], PyLong_AsLongLong(v))) bad = 1;
            Py_DECREF(v);
        }
        Py_DECREF(itq);
        if (PyErr_Occurred()) bad = 1;
    }
    Py_XDECREF(power); Py_XDECREF(seqs); Py_XDECREF(waiting);
    return bad ? -1 : 0;
nomem:
    PyErr_NoMemory();
fail:
    Py_XDECREF(ranges);
    return -1;
}

static int store(PyObject *s, PyObject *st, Replicas *x, EventHeap *heap, int64_t next_seq, PyObject *boundary) {
    Py_ssize_t R = x->R, P = x->P;
    if (put_ints(s, "it", x->it, R) || put_ints(s, "c0", x->c0, R) || put_ints(s, "g", x->g, R)
        || put_ints(s, "token", x->token, R) || put_ints(s, "run", x->run, R)
        || put_ints(s, "outstanding", x->outstanding, R) || put_doubles(s, "ref", x->ref, R)
        || put_doubles(s, "d0", x->d0, R) || put_doubles(s, "d1", x->d1, R)
        || put_doubles(st, "batch_last", x->batch_last, R) || put_doubles(st, "batch_area", x->batch_area, R)
        || put_doubles(st, "energy", x->energy, R) || put_ints(st, "in_system", x->in_system, P)
        || put_doubles(st, "system_last", x->system_last, P) || put_doubles(st, "system_area", x->system_area, P))
        return -1;
    PyObject *seqs = PyObject_GetAttrString(s, "seqs"), *waiting = PyObject_GetAttrString(s, "waiting");
    PyObject *hp = PyObject_GetAttrString(st, "heap");
    int bad = !seqs || !waiting || !hp;
    for (Py_ssize_t r = 0; !bad && r < R; r++) {
        PyObject *keys = PyList_New(x->seqs[r].n);
        if (!keys) { bad = 1; break; }
        for (Py_ssize_t k = 0; k < x->seqs[r].n; k++) PyList_SET_ITEM(keys, k, PyLong_FromLongLong(x->seqs[r].a[k]));
        PyObject *sq = PyList_GetItem(seqs, r);
        if (!sq || PyList_SetSlice(sq, 0, PyList_GET_SIZE(sq), keys)) bad = 1;
        Py_DECREF(keys);
        PyObject *q = bad ? NULL : PyList_GetItem(waiting, r);
        PyObject *res = q ? PyObject_CallMethod(q, "clear", NULL) : NULL;
        Py_XDECREF(res);
        if (!res) { bad = 1; break; }
        for (Py_ssize_t k = 0; !bad && k < x->waiting[r].n; k++) {
            int64_t i = x->waiting[r].a[(x->waiting[r].head + k) % x->waiting[r].cap];
            res = PyObject_CallMethod(q, "append", "L", (long long)i);
            if (!res) bad = 1;
            Py_XDECREF(res);
        }
    }
    if (!bad) {   /* the live entries as heapq tuples (at, seq, kind, r), in the heap's own valid order */
        PyObject *entries = PyList_New(heap->n);
        if (!entries) bad = 1;
        for (Py_ssize_t k = 0; !bad && k < heap->n; k++) {
            PyObject *e = Py_BuildValue("(dLOL)", heap->a[k].at, (long long)heap->a[k].seq, boundary,
                                        (long long)heap->a[k].r);
            if (!e) { bad = 1; break; }
            PyList_SET_ITEM(entries, k, e);
        }
        if (!bad && PyList_SetSlice(hp, 0, PyList_GET_SIZE(hp), entries)) bad = 1;
        Py_XDECREF(entries);
    }
    if (!bad) {   /* the run's sequence numbers go on from where the loop left them */
        PyObject *itertools = PyImport_ImportModule("itertools");
        PyObject *count = itertools ? PyObject_CallMethod(itertools, "count", "L", (long long)next_seq) : NULL;
        Py_XDECREF(itertools);
        if (!count || PyObject_SetAttrString(s, "counter", count) || PyObject_SetAttrString(st, "counter", count))
            bad = 1;
        Py_XDECREF(count);
    }
    Py_XDECREF(seqs); Py_XDECREF(waiting); Py_XDECREF(hp);
    return bad ? -1 : 0;
}

static PyObject *run(PyObject *self, PyObject *args) {
    PyObject *s, *st, *times_obj, *order_obj;
    double horizon_s;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOd", &s, &st, &times_obj, &order_obj, &horizon_s)) return NULL;

    Replicas x;
    memset(&x, 0, sizeof x);
    Column lin = {0}, kch = {0}, lout = {0}, rpool = {0}, alpha = {0}, beta = {0}, start = {0}, first = {0},
           end = {0}, rep = {0};
    Py_buffer tb = {0}, ob = {0};
    EventHeap heap = {0};
    PyObject *result = NULL, *boundary = NULL, *counter = NULL, *seq0 = NULL;
    int64_t M = 0, sn = 0;
    double lo_s = 0.0, hi_s = 0.0;

    if (column(s, "lin", &lin, 0) || column(s, "kch", &kch, 0) || column(s, "lout", &lout, 0)
        || column(s, "rpool", &rpool, 0) || column(s, "alpha", &alpha, 0) || column(s, "beta", &beta, 0)
        || column(s, "start", &start, 1) || column(s, "first", &first, 1) || column(s, "end", &end, 1)
        || column(s, "rep", &rep, 1))
        goto done;
    if (alpha.kind != 'd' || beta.kind != 'd' || start.kind != 'd' || first.kind != 'd' || end.kind != 'd'
        || rep.kind != 'q' || lin.kind == 'd' || kch.kind == 'd' || lout.kind == 'd' || rpool.kind == 'd') {
        PyErr_SetString(PyExc_TypeError, "_cloop: a per-request column has an unexpected type");
        goto done;
    }
    if (PyObject_GetBuffer(times_obj, &tb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
        || PyObject_GetBuffer(order_obj, &ob, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        goto done;
    if (tb.itemsize != 8 || ob.itemsize != 8 || tb.len != ob.len) {
        PyErr_SetString(PyExc_TypeError, "_cloop: times and order must be float64 and int64 arrays of one length");
        goto done;
    }
    if (load(s, st, &x)) goto done;
    {
        PyObject *o = PyObject_GetAttrString(s, "M");
        if (!o) goto done;
        M = PyLong_AsLongLong(o);
        Py_DECREF(o);
        o = PyObject_GetAttrString(st, "lo_s");
        if (!o) goto done;
        lo_s = PyFloat_AsDouble(o);
        Py_DECREF(o);
        o = PyObject_GetAttrString(st, "hi_s");
        if (!o) goto done;
        hi_s = PyFloat_AsDouble(o);
        Py_DECREF(o);
        if (PyErr_Occurred()) goto done;
    }
    boundary = PyObject_GetAttrString(s, "boundary_kind");
    counter = PyObject_GetAttrString(s, "counter");
    if (!boundary || !counter) goto done;
    seq0 = PyIter_Next(counter);          /* the first sequence number the Python loop would take */
    if (!seq0) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_cloop: counter ended"); goto done; }
    sn = PyLong_AsLongLong(seq0);
    if (sn == -1 && PyErr_Occurred()) goto done;

    const double *times = tb.buf;
    const int64_t *order = ob.buf;
    const Py_ssize_t n_arr = tb.len / 8;
    double *START = start.view.buf, *FIRST = first.view.buf, *END = end.view.buf;
    int64_t *REP = rep.view.buf;
    const double *ALPHA = alpha.view.buf, *BETA = beta.view.buf;
    const Requests req = {&kch, &lout, ALPHA, BETA, START, FIRST};
    const double inf = INFINITY;
    Py_ssize_t j = 0;
    int64_t events = 0;
    double last_at = 0.0;
    double next_arrival = n_arr ? times[0] : inf;

    while (1) {
        double service_at = heap.n ? heap.a[0].at : inf;
        if (service_at <= next_arrival) {
            /* ---- a heap event: a replica boundary ---- */
            if (service_at > horizon_s || service_at == inf) break;
            Event ev = eheap_pop(&heap);
            double at = ev.at;
            int64_t r = ev.r;
            events += 1;
            last_at = at;
            if (x.token[r] != ev.seq) continue;
            IntHeap *sq = &x.seqs[r];
            int64_t ch = x.chunk[r];
            int64_t e = sq->a[0] / M;
            int64_t m = e - x.it[r];
            int64_t gr = x.g[r];
            int64_t c = x.c0[r] + m * gr;
            double f0 = x.d0[r] + (double)m * x.d1[r], f1 = x.d1[r], gdr = x.gd[r];
            x.it[r] = e;
            x.ref[r] = at;
            double t = at < lo_s ? lo_s : (at > hi_s ? hi_s : at);
            double dt = t - x.batch_last[r];
            int64_t n = x.run[r];
            if (dt > 0) {
                x.batch_area[r] += (double)n * dt;
                x.energy[r] += x.power[r][n] * dt;
                x.batch_last[r] = t;
            }
            int64_t done = 0;
            int64_t lim = (e + 1) * M;
            while (sq->n && sq->a[0] < lim) {
                int64_t key = iheap_pop(sq);
                int64_t i = (key % M) >> 2;
                int64_t li = int_at(&lin, i), lo = int_at(&lout, i);
                if (!(key & 1)) {
                    FIRST[i] = at;
                    int64_t ki = int_at(&kch, i);
                    c += li - ki * ch;
                    gr += 1 - ch;
                    double b_i = BETA[i];
                    f0 -= ALPHA[i] + b_i * (double)ki;
                    f1 -= b_i;
                    if (lo) {
                        f0 += gdr;
                        if (iheap_push(sq, (e + lo) * M + 4 * i + 1)) goto done;
                        continue;
                    }
                } else {
                    f0 -= gdr;
                }
                END[i] = at;
                c -= li + lo;
                gr -= 1;
                done += 1;
            }
            if (done) {
                int64_t p = x.replica_pool[r];
                dt = t - x.system_last[p];
                if (dt > 0) {
                    x.system_area[p] += (double)x.in_system[p] * dt;
                    x.system_last[p] = t;
                }
                x.in_system[p] -= done;
                n -= done;
                x.outstanding[r] -= done;
            }
            if (!n) f0 = f1 = 0.0;
            Fifo *q = &x.waiting[r];
            if (q->n) {
                int64_t cr = x.cap[r];
                while (q->n && n < cr) {
                    int64_t i = fifo_pop(q);
                    n += 1;
                    if (admit(&req, sq, i, at, e, ch, gdr, M, &gr, &f0, &f1)) goto done;
                }
            }
            x.run[r] = n;
            x.c0[r] = c; x.g[r] = gr; x.d0[r] = f0; x.d1[r] = f1;
            if (n) {
                int64_t mm = sq->a[0] / M - e;
                double hr = x.h[r];
                Event ne = {at + (double)mm * (x.W[r] + hr * (double)c + f0)
                                + (hr * (double)gr + f1) * (double)(mm * (mm - 1) / 2), sn++, r};
                if (eheap_push(&heap, ne)) goto done;
                x.token[r] = ne.seq;
            } else {
                x.token[r] = -1;
            }
            continue;
        }
        /* ---- an arrival ---- */
        double now = next_arrival;
        if (now > horizon_s) break;
        int64_t i = order[j];
        j += 1;
        next_arrival = j < n_arr ? times[j] : inf;
        events += 1;
        last_at = now;
        int64_t p = int_at(&rpool, i);
        double t = now < lo_s ? lo_s : (now > hi_s ? hi_s : now);
        double dt = t - x.system_last[p];
        if (dt > 0) {
            x.system_area[p] += (double)x.in_system[p] * dt;
            x.system_last[p] = t;
        }
        x.in_system[p] += 1;
        int64_t r = x.span_lo[p], hi = x.span_hi[p];
        if (hi - r > 1) {                     /* JoinShortestQueue: the first replica with the fewest */
            int64_t best = r;
            for (int64_t k = r + 1; k < hi; k++) if (x.outstanding[k] < x.outstanding[best]) best = k;
            r = best;
        }
        x.outstanding[r] += 1;
        REP[i] = r;
        int64_t n = x.run[r];
        if (n >= x.cap[r]) {
            if (fifo_push(&x.waiting[r], i)) goto done;
            continue;
        }
        double hr = x.h[r], wr = x.W[r];
        int64_t cr = x.c0[r], gr = x.g[r], itr = x.it[r];
        double f0 = x.d0[r], f1 = x.d1[r];
        double b;
        if (!n) {
            x.ref[r] = b = now;
        } else {
            b = x.ref[r];
            if (now > b) {
                double w = wr + hr * (double)cr + f0, a = hr * (double)gr + f1;
                double xx = now - b;
                double mf = ceil(a == 0 ? xx / w : (sqrt(pow(w - a / 2, 2.0) + 2 * a * xx) - (w - a / 2)) / a);
                int64_t m = (int64_t)mf;
                double tm = b + (double)m * w + a * (double)(m * (m - 1) / 2);
                while (tm < now) {
                    m += 1;
                    tm = b + (double)m * w + a * (double)(m * (m - 1) / 2);
                }
                while (m > 0) {
                    double tt = b + (double)(m - 1) * w + a * (double)((m - 1) * (m - 2) / 2);
                    if (tt < now) break;
                    m -= 1;
                    tm = tt;
                }
                x.ref[r] = b = tm;
                cr += m * gr;
                f0 += (double)m * f1;
                itr += m;
            }
        }
        t = b < lo_s ? lo_s : (b > hi_s ? hi_s : b);
        dt = t - x.batch_last[r];
        if (dt > 0) {
            x.batch_area[r] += (double)n * dt;
            x.energy[r] += x.power[r][n] * dt;
            x.batch_last[r] = t;
        }
        x.run[r] = n + 1;
        IntHeap *sq = &x.seqs[r];
        if (admit(&req, sq, i, b, itr, x.chunk[r], x.gd[r], M, &gr, &f0, &f1)) goto done;
        x.c0[r] = cr; x.g[r] = gr; x.d0[r] = f0; x.d1[r] = f1; x.it[r] = itr;
        int64_t m = sq->a[0] / M - itr;
        Event ne = {b + (double)m * (wr + hr * (double)cr + f0) + (hr * (double)gr + f1) * (double)(m * (m - 1) / 2),
                    sn++, r};
        if (eheap_push(&heap, ne)) goto done;
        x.token[r] = ne.seq;
    }
    if (store(s, st, &x, &heap, sn, boundary)) goto done;
    result = Py_BuildValue("(dL)", last_at, (long long)events);

done:
    free_replicas(&x);
    free(heap.a);
    Column *cols[] = {&lin, &kch, &lout, &rpool, &alpha, &beta, &start, &first, &end, &rep};
    for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++) if (cols[k]->view.obj) PyBuffer_Release(&cols[k]->view);
    if (tb.obj) PyBuffer_Release(&tb);
    if (ob.obj) PyBuffer_Release(&ob);
    Py_XDECREF(boundary); Py_XDECREF(counter); Py_XDECREF(seq0);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(station, state, times, order, horizon_s) -> (last_at, events): the plain loop, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cloop", "The simulator's plain event loop, compiled.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cloop(void) { return PyModule_Create(&module); }
