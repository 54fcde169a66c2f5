/* Streams (one worker thread each; every item runs no earlier than
 * CUDA_STANDIN_STREAM_DELAY_MS after it was queued, in order), events, IPC events. */
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct stream *all_streams;
struct event *all_events;

#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void timed_wait(pthread_cond_t *cv, uint64_t ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_cond_timedwait(cv, &G, &ts);
}

static int ev_done(struct evshared *e, uint64_t gen) {
    return __atomic_load_n(&e->done, __ATOMIC_ACQUIRE) >= gen;
}

static void ev_complete(struct evshared *e, uint64_t gen) {
    uint64_t cur = __atomic_load_n(&e->done, __ATOMIC_ACQUIRE);
    while (cur < gen && !__atomic_compare_exchange_n(&e->done, &cur, gen, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
}

/* Runs with G held. */
static void run_item(struct stream *s, struct item *it) {
    const char *why = NULL;
    CUresult rc = CUDA_SUCCESS;
    size_t bytes = it->kind == IT_MEMSET16 ? it->n * 2 : it->kind == IT_MEMSET32 ? it->n * 4 : it->n;
    switch (it->kind) {
    case IT_MEMSET8: case IT_MEMSET16: case IT_MEMSET32: case IT_COPY:
        if (s->ctx->sticky) break;   /* a faulted context runs nothing more */
        if (it->dst_dev) rc = check_range((uintptr_t)it->dst, bytes, ACC_RW, s->ctx->dev, &why);
        if (!rc && it->kind == IT_COPY && it->src_dev) rc = check_range((uintptr_t)it->src, bytes, ACC_READ, s->ctx->dev, &why);
        if (rc) {
            s->ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
            violation(CUDA_ERROR_ILLEGAL_ADDRESS, it->call,
                      "queued work ran after its memory changed under it (%s); the context is now unusable (sticky error, as on a GPU)", why);
            break;
        }
        if (it->kind == IT_COPY) memmove(it->dst, it->src, it->n);
        else do_memset(it->kind, it->dst, it->val, it->n);
        break;
    case IT_RECORD:
        ev_complete(it->ev, it->gen);
        break;
    case IT_HOSTFN:
        UNLOCK();
        it->fn(it->ud);
        LOCK();
        break;
    case IT_WAIT:
        break;   /* waited for before running */
    }
}

static void *worker(void *arg) {
    struct stream *s = arg;
    LOCK();
    for (;;) {
        while (!s->head && s->alive) pthread_cond_wait(&s->cv, &G);
        if (!s->head) break;
        struct item *it = s->head;
        s->running = 1;
        uint64_t now = now_ns();
        if (it->due > now) { UNLOCK(); sleep_ns(it->due - now); LOCK(); }
        if (it->kind == IT_WAIT)
            while (!ev_done(it->ev, it->gen)) timed_wait(&G_done, 1000000);
        run_item(s, it);
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->done_seq = it->seq;
        s->running = 0;
        free(it);
        pthread_cond_broadcast(&G_done);
    }
    UNLOCK();
    return NULL;
}

struct stream *stream_new(struct ctx *c, unsigned flags, int is_null) {
    struct stream *s = calloc(1, sizeof *s);
    s->magic = STANDIN_MAGIC;
    s->alive = 1;
    s->flags = flags;
    s->is_null = is_null;
    s->ctx = c;
    pthread_cond_init(&s->cv, NULL);
    s->next_all = all_streams;
    all_streams = s;
    return s;
}

static int stream_known(struct stream *s) {
    for (struct stream *x = all_streams; x; x = x->next_all) if (x == s) return 1;
    return 0;
}

struct stream *stream_resolve(struct ctx *c, CUstream h, const char *call, CUresult *rc) {
    if (h == NULL || h == STREAM_LEGACY || h == STREAM_PER_THREAD) return c->null_stream;
    if (!stream_known(h) || h->magic != STANDIN_MAGIC) {
        *rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "%p is not a stream handle", (void *)h);
        return NULL;
    }
    if (!h->alive) { *rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "stream %p was destroyed", (void *)h); return NULL; }
    if (h->ctx != c) { *rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "stream %p belongs to another context than the current one", (void *)h); return NULL; }
    return h;
}

CUresult enqueue(struct stream *s, struct item *it) {
    if (!s->thread_started) {
        if (pthread_create(&s->thread, NULL, worker, s) != 0) { const char *call = it->call; free(it); return violation(CUDA_ERROR_OUT_OF_MEMORY, call, "cannot start a stream worker thread"); }
        pthread_detach(s->thread);
        s->thread_started = 1;
    }
    it->due = now_ns() + (uint64_t)cfg.delay_ms * 1000000ull;
    it->seq = ++s->enq_seq;
    it->next = NULL;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv);
    return CUDA_SUCCESS;
}

void stream_drain(struct stream *s) {
    uint64_t target = s->enq_seq;
    while (s->done_seq < target) pthread_cond_wait(&G_done, &G);
}

/* blocking_only: the legacy default stream and the blocking streams (what a synchronous copy waits for) */
void ctx_drain(struct ctx *c, int blocking_only) {
    for (struct stream *s = all_streams; s; s = s->next_all)
        if (s->ctx == c && (s->alive || s->head) && !(blocking_only && (s->flags & 1))) stream_drain(s);
}

void ctx_streams_teardown(struct ctx *c) {
    for (struct stream *s = all_streams; s; s = s->next_all)
        if (s->ctx == c && s->alive) { s->alive = 0; pthread_cond_signal(&s->cv); }
    for (struct event *e = all_events; e; e = e->next_all)
        if (e->ctx == c && e->alive) {
            e->alive = 0;
            if (e->ipc_file && !e->imported) unlink(e->path);
        }
}

/* ------------------------------------------------------------------ streams */
EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned flags) {
    const char *call = "cuStreamCreate";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (!rc && !ps) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "stream pointer is NULL");
    if (!rc && (flags & ~1u)) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x: only CU_STREAM_DEFAULT (0) and CU_STREAM_NON_BLOCKING (1)", flags);
    if (!rc) *ps = stream_new(c, flags, 0);
    UNLOCK();
    return rc;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned flags, int prio) { (void)prio; return cuStreamCreate(ps, flags); }

EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
    const char *call = "cuStreamDestroy_v2";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (h == NULL || h == STREAM_LEGACY || h == STREAM_PER_THREAD) { rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "the default stream cannot be destroyed"); goto out; }
    struct stream *s = stream_resolve(c, h, call, &rc);
    if (!s) goto out;
    s->alive = 0;   /* queued work still completes, as on a GPU; the handle stays poisoned */
    pthread_cond_signal(&s->cv);
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuStreamDestroy(CUstream h) {
    note("cuStreamDestroy: is the pre-v2 entry point; call cuStreamDestroy_v2");
    return cuStreamDestroy_v2(h);
}

EXPORT CUresult cuStreamSynchronize(CUstream h) {
    const char *call = "cuStreamSynchronize";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, h, call, &rc);
    if (s) {
        if (s->is_null) ctx_drain(c, 1); else stream_drain(s);
        if (c->sticky) rc = c->sticky;
    }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuStreamQuery(CUstream h) {
    const char *call = "cuStreamQuery";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, h, call, &rc);
    if (s) rc = c->sticky ? c->sticky : s->done_seq < s->enq_seq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned *flags) {
    const char *call = "cuStreamGetFlags";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, h, call, &rc);
    if (s && flags) *flags = s->flags;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *pc) {
    const char *call = "cuStreamGetCtx";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, h, call, &rc);
    if (s && pc) *pc = s->ctx;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *ud) {
    const char *call = "cuLaunchHostFunc";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, h, call, &rc);
    if (s && !fn) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "fn is NULL"); s = NULL; }
    if (s) {
        struct item *it = calloc(1, sizeof *it);
        it->kind = IT_HOSTFN; it->call = call; it->fn = fn; it->ud = ud;
        rc = enqueue(s, it);
    }
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ events */
#define EV_DISABLE_TIMING 2u
#define EV_INTERPROCESS 4u

static struct event *event_resolve(CUevent h, const char *call, CUresult *rc) {
    struct event *e = all_events;
    while (e && e != h) e = e->next_all;
    if (!e || e->magic != STANDIN_MAGIC) { *rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "%p is not an event handle", (void *)h); return NULL; }
    if (!e->alive) { *rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "event %p was destroyed", (void *)h); return NULL; }
    return e;
}

static struct event *event_alloc(struct ctx *c, unsigned flags) {
    struct event *e = calloc(1, sizeof *e);
    e->magic = STANDIN_MAGIC; e->alive = 1; e->flags = flags; e->ctx = c;
    e->next_all = all_events; all_events = e;
    return e;
}

static struct evshared *map_evfile(const char *path, int create) {
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0666);
    if (fd < 0) return NULL;
    if (create) { fchmod(fd, 0666); if (ftruncate(fd, 4096) != 0) { close(fd); return NULL; } }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct evshared)) { close(fd); return NULL; }
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned flags) {
    const char *call = "cuEventCreate";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (!pe) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "event pointer is NULL"); goto out; }
    if (flags & ~7u) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "unknown flags 0x%x", flags); goto out; }
    if ((flags & EV_INTERPROCESS) && !(flags & EV_DISABLE_TIMING)) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING");
        goto out;
    }
    struct event *e = event_alloc(c, flags);
    if (flags & EV_INTERPROCESS) {
        e->key_pid = self_pid; e->key_start = self_start; e->key_seq = next_seq();
        snprintf(e->path, sizeof e->path, "%s/ev-%" PRIu64 "-%" PRIu64 "-%" PRIu64, cfg.dir, e->key_pid, e->key_start, e->key_seq);
        e->sh = map_evfile(e->path, 1);
        if (!e->sh) { e->alive = 0; rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "cannot create %s: %s", e->path, strerror(errno)); goto out; }
        e->sh->magic = STANDIN_MAGIC;
        e->ipc_file = 1;
    } else {
        e->sh = calloc(1, sizeof *e->sh);
    }
    *pe = e;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuEventDestroy_v2(CUevent h) {
    const char *call = "cuEventDestroy_v2";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    struct event *e = rc ? NULL : event_resolve(h, call, &rc);
    if (e) {
        e->alive = 0;   /* poisoned, never reused; pending records complete into e->sh harmlessly */
        if (e->ipc_file && !e->imported) unlink(e->path);
    }
    UNLOCK();
    return rc;
}
EXPORT CUresult cuEventDestroy(CUevent h) {
    note("cuEventDestroy: is the pre-v2 entry point; call cuEventDestroy_v2");
    return cuEventDestroy_v2(h);
}

static CUresult record(const char *call, CUevent h, CUstream hs) {
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct event *e = rc ? NULL : event_resolve(h, call, &rc);
    struct stream *s = e ? stream_resolve(c, hs, call, &rc) : NULL;
    if (s && e->ctx != c && !e->imported) { rc = violation(CUDA_ERROR_INVALID_HANDLE, call, "event %p belongs to another context", (void *)h); s = NULL; }
    if (s) {
        struct item *it = calloc(1, sizeof *it);
        it->kind = IT_RECORD; it->call = call; it->ev = e->sh;
        it->gen = __atomic_add_fetch(&e->sh->rec, 1, __ATOMIC_ACQ_REL);
        rc = enqueue(s, it);
    }
    UNLOCK();
    return rc;
}
EXPORT CUresult cuEventRecord(CUevent h, CUstream s) { return record("cuEventRecord", h, s); }
EXPORT CUresult cuEventRecordWithFlags(CUevent h, CUstream s, unsigned flags) {
    if (flags) return violation(CUDA_ERROR_INVALID_VALUE, "cuEventRecordWithFlags", "flags 0x%x are not supported by the stand-in", flags);
    return record("cuEventRecordWithFlags", h, s);
}

EXPORT CUresult cuEventQuery(CUevent h) {
    const char *call = "cuEventQuery";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    struct event *e = rc ? NULL : event_resolve(h, call, &rc);
    if (e) rc = ev_done(e->sh, __atomic_load_n(&e->sh->rec, __ATOMIC_ACQUIRE)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuEventSynchronize(CUevent h) {
    const char *call = "cuEventSynchronize";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    struct event *e = rc ? NULL : event_resolve(h, call, &rc);
    if (e) {
        struct evshared *sh = e->sh;
        uint64_t gen = __atomic_load_n(&sh->rec, __ATOMIC_ACQUIRE);
        while (!ev_done(sh, gen)) timed_wait(&G_done, e->imported ? 500000 : 5000000);
    }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    (void)ms; (void)a; (void)b;
    return violation(CUDA_ERROR_NOT_SUPPORTED, "cuEventElapsedTime", "timings are only meaningful on a real GPU");
}

EXPORT CUresult cuStreamWaitEvent(CUstream hs, CUevent h, unsigned flags) {
    const char *call = "cuStreamWaitEvent";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    struct stream *s = rc ? NULL : stream_resolve(c, hs, call, &rc);
    struct event *e = s ? event_resolve(h, call, &rc) : NULL;
    if (e && flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags must be 0"); e = NULL; }
    if (e) {
        struct item *it = calloc(1, sizeof *it);
        it->kind = IT_WAIT; it->call = call; it->ev = e->sh;
        it->gen = __atomic_load_n(&e->sh->rec, __ATOMIC_ACQUIRE);
        rc = enqueue(s, it);
    }
    UNLOCK();
    return rc;
}

/* IPC events */
struct ipc_ev {
    uint64_t magic;
    uint64_t kpid, kstart, kseq, pidns, check;
    uint64_t pad[2];
};
_Static_assert(sizeof(struct ipc_ev) == 64, "ipc event handle");
#define IPC_EV_MAGIC 0x5645435049535343ULL

static uint64_t ipc_ev_check(const struct ipc_ev *h) { return fnv1a(h, offsetof(struct ipc_ev, check)); }

EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *out, CUevent h) {
    const char *call = "cuIpcGetEventHandle";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    struct event *e = rc ? NULL : event_resolve(h, call, &rc);
    if (e && !out) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle pointer is NULL"); e = NULL; }
    if (e && !(e->flags & EV_INTERPROCESS)) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the event was not created with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING");
        e = NULL;
    }
    if (e) {
        struct ipc_ev x = {IPC_EV_MAGIC, e->key_pid, e->key_start, e->key_seq, self_pidns, 0, {0, 0}};
        x.check = ipc_ev_check(&x);
        memcpy(out, &x, 64);
    }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuIpcOpenEventHandle(CUevent *pe, CUipcEventHandle handle) {
    const char *call = "cuIpcOpenEventHandle";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (!pe) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "event pointer is NULL"); goto out; }
    struct ipc_ev x;
    memcpy(&x, &handle, 64);
    if (x.magic != IPC_EV_MAGIC || x.check != ipc_ev_check(&x)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the 64 bytes are not a handle from cuIpcGetEventHandle"); goto out; }
    if (x.pidns != self_pidns) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the handle was exported in another PID namespace"); goto out; }
    if (x.kpid == self_pid && x.kstart == self_start) { rc = violation(CUDA_ERROR_INVALID_CONTEXT, call, "the handle was exported by this same process (use the event itself)"); goto out; }
    char path[600];
    snprintf(path, sizeof path, "%s/ev-%" PRIu64 "-%" PRIu64 "-%" PRIu64, cfg.dir, x.kpid, x.kstart, x.kseq);
    struct evshared *sh = map_evfile(path, 0);
    if (!sh || sh->magic != STANDIN_MAGIC) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the exported event was destroyed (or its process exited)"); goto out; }
    struct event *e = event_alloc(c, EV_INTERPROCESS | EV_DISABLE_TIMING);
    e->sh = sh; e->ipc_file = 1; e->imported = 1;
    e->key_pid = x.kpid; e->key_start = x.kstart; e->key_seq = x.kseq;
    snprintf(e->path, sizeof e->path, "%s", path);
    *pe = e;
out:
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ process exit */
void mem_exit_cleanup(void);
__attribute__((destructor)) static void standin_exit(void) {
    if (initialized != 1 || pthread_mutex_trylock(&G) != 0) return;
    for (struct event *e = all_events; e; e = e->next_all)
        if (e->alive && e->ipc_file && !e->imported) unlink(e->path);
    mem_exit_cleanup();
    UNLOCK();
}
