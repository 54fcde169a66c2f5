/* gpumemd CUDA stand-in driver: shared declarations.
 * Types follow cuda.h (64-bit Linux ABI) without including it. */
#ifndef CUDA_STANDIN_H
#define CUDA_STANDIN_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct ctx *CUcontext;
typedef struct stream *CUstream;
typedef struct event *CUevent;
typedef void (*CUhostFn)(void *userData);

typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;

typedef struct { int type; int id; } CUmemLocation;            /* 8 bytes */
typedef struct {
    int type;                   /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes;   /* bit mask, POSIX fd = 1 */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;                                          /* 32 bytes */
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc; /* 12 bytes */

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 16
#define STANDIN_MAGIC 0x4353494e44415453ULL /* "STADNISC" */

/* ---- configuration and devices (core.c) ---- */
struct device {
    int phys;                 /* physical index: name, UUID, PCI ids, ledger key */
    CUuuid uuid;
    struct ctx *primary;      /* lazily created */
    int primary_refs;
    unsigned primary_flags;
};

struct config {
    int ndev;                 /* visible devices */
    int nphys;
    size_t total_bytes;
    size_t granularity;
    long delay_ms;
    int vmm;
    int memset_async;         /* CUDA_STANDIN_MEMSET_ASYNC: plain cuMemsetD* queue on the legacy stream */
    char dir[512];
    char log[512];
};

/* ---- contexts ---- */
struct ctx {
    uint64_t magic;
    int dev;                  /* visible ordinal */
    int primary;
    int alive;                /* 0 once destroyed / primary released to zero */
    unsigned flags;
    int sticky;               /* sticky asynchronous error (e.g. ILLEGAL_ADDRESS) */
    struct stream *null_stream;
    struct ctx *next_all;
};

/* ---- streams and events (stream.c) ---- */
struct evshared {             /* in a shared file for INTERPROCESS events */
    uint64_t magic;
    uint64_t rec;             /* generation of the latest record (0: never) */
    uint64_t done;            /* highest completed generation */
};

struct event {
    uint64_t magic;
    int alive;
    unsigned flags;
    struct ctx *ctx;
    struct evshared *sh;
    int ipc_file;             /* sh is a mapping of a file in the state dir */
    int imported;             /* opened from another process's handle */
    uint64_t key_pid, key_start, key_seq;
    char path[600];
    struct event *next_all;
};

struct item;
struct stream {
    uint64_t magic;
    int alive;
    unsigned flags;
    int is_null;
    struct ctx *ctx;
    struct item *head, *tail;
    uint64_t enq_seq, done_seq;
    int running;              /* worker executing the head item */
    pthread_t thread;
    int thread_started;
    pthread_cond_t cv;
    struct stream *next_all;
};

/* ---- global state ---- */
extern pthread_mutex_t G;       /* the driver lock */
extern pthread_cond_t G_done;   /* broadcast whenever a stream item completes */
extern struct config cfg;
extern struct device devs[MAX_DEVICES];
extern int initialized;         /* 1 ok, -1 cuInit failed */
extern uint64_t self_pid, self_start, self_pidns;
extern struct ctx *all_ctx;
extern struct stream *all_streams;
extern struct event *all_events;

/* logging and errors */
CUresult violation(CUresult rc, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *err_name(CUresult rc);
CUresult standin_unsupported(const char *call);

/* checks, must hold G */
CUresult need_init(const char *call);
CUresult need_ctx(const char *call, struct ctx **out);
int ctx_valid(struct ctx *c);
int dev_valid(int d);
uint64_t proc_start_time(pid_t pid);  /* 0 if the process is gone */
int proc_alive(uint64_t pid, uint64_t start);
uint64_t now_ns(void);
uint64_t next_seq(void);

/* node-wide memory ledger (ledger.c) */
int ledger_open(void);
int ledger_hold(uint64_t kpid, uint64_t kstart, uint64_t kseq, int phys, size_t size);  /* 0 or -1 full */
void ledger_drop(uint64_t kpid, uint64_t kstart, uint64_t kseq);
size_t ledger_used(int phys);
int ledger_reserve(int phys, size_t size, uint64_t kpid, uint64_t kstart, uint64_t kseq); /* 0 ok, -1 OOM */

/* memory (mem.c) */
enum access { ACC_NONE = 0, ACC_READ = 1, ACC_RW = 3 };
/* Validates [p, p+n) as device memory usable by device `dev` for `need` access.
 * Returns 0 ok, else CUDA_ERROR_INVALID_VALUE (not device memory / out of range)
 * or CUDA_ERROR_ILLEGAL_ADDRESS (mapped without the needed access). why gets the rule. */
CUresult check_range(uintptr_t p, size_t n, int need, int dev, const char **why);
void mem_ctx_teardown(struct ctx *c);
void sweep_dead_files(void);

/* streams (stream.c) */
struct stream *stream_resolve(struct ctx *c, CUstream s, const char *call, CUresult *rc);
struct stream *stream_new(struct ctx *c, unsigned flags, int is_null);
void ctx_drain(struct ctx *c, int blocking_only);   /* must hold G */
void stream_drain(struct stream *s);                /* must hold G */
void ctx_streams_teardown(struct ctx *c);
enum { IT_MEMSET8, IT_MEMSET16, IT_MEMSET32, IT_COPY, IT_RECORD, IT_WAIT, IT_HOSTFN };
struct item {
    int kind;
    struct item *next;
    uint64_t due;
    uint64_t seq;
    const char *call;
    void *dst; const void *src; size_t n; uint32_t val;
    int dst_dev, src_dev;     /* check the range again when it runs */
    struct evshared *ev; uint64_t gen;
    CUhostFn fn; void *ud;
};
CUresult enqueue(struct stream *s, struct item *it);
void do_memset(int kind, void *dst, uint32_t val, size_t n);

#define LOCK() pthread_mutex_lock(&G)
#define UNLOCK() pthread_mutex_unlock(&G)

/* FNV-1a over n bytes: the check word of the 64-byte IPC handles (memory and events). */
static inline uint64_t fnv1a(const void *data, size_t n) {
    uint64_t x = 0xcbf29ce484222325ull;
    const unsigned char *b = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) x = (x ^ b[i]) * 0x100000001b3ull;
    return x;
}

#endif
