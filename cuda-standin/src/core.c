/* Logging, error names, configuration, cuInit, devices, contexts. */
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t G_done = PTHREAD_COND_INITIALIZER;
struct config cfg;
struct device devs[MAX_DEVICES];
int initialized;
uint64_t self_pid, self_start, self_pidns;
struct ctx *all_ctx;

static __thread struct ctx *tstack[64];
static __thread int tdepth;

/* ------------------------------------------------------------------ errors */
static const struct { int code; const char *name, *text; } errs[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {909, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const char *err_name(CUresult rc) {
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == rc) return errs[i].name;
    return "CUDA_ERROR_UNKNOWN";
}

EXPORT CUresult cuGetErrorString(CUresult rc, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == rc) { *s = errs[i].text; return CUDA_SUCCESS; }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult rc, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].code == rc) { *s = errs[i].name; return CUDA_SUCCESS; }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ logging */
static void emit(const char *line, size_t n) {
    const char *path = cfg.log[0] ? cfg.log : getenv("CUDA_STANDIN_LOG");
    int fd = 2, own = 0;
    if (path && *path) {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) fd = 2; else own = 1;
    }
    ssize_t w = write(fd, line, n);
    (void)w;
    if (own) close(fd);
}

void note(const char *fmt, ...) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "cuda-standin: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - n - 2, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    emit(buf, n);
}

CUresult violation(CUresult rc, const char *call, const char *fmt, ...) {
    char rule[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rule, sizeof rule, fmt, ap);
    va_end(ap);
    note("%s: %s -> %s", call, rule, err_name(rc));
    return rc;
}

CUresult standin_unsupported(const char *call) {
    return violation(CUDA_ERROR_NOT_SUPPORTED, call, "not implemented by the stand-in driver");
}

/* ------------------------------------------------------------------ helpers */
uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t seq_counter;
uint64_t next_seq(void) { return __atomic_add_fetch(&seq_counter, 1, __ATOMIC_SEQ_CST); }

uint64_t proc_start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2;                                  /* field 3: state */
    if (*p == 'Z' || *p == 'X') return 0;    /* a zombie holds nothing */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

int proc_alive(uint64_t pid, uint64_t start) {
    if (pid == self_pid && start == self_start) return 1;
    uint64_t s = proc_start_time((pid_t)pid);
    return s != 0 && s == start;
}

static int env_long(const char *name, long long def, long long *out) {
    const char *v = getenv(name);
    if (!v || !*v) { *out = def; return 0; }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 0);
    if (errno || *end || x < 0) { note("cuInit: %s=%s is not a number; using %lld", name, v, def); *out = def; return -1; }
    *out = x;
    return 0;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_uuid(int phys, CUuuid *u) {
    uint64_t h = 1469598103934665603ull;
    const char *seed = getenv("CUDA_STANDIN_UUID_SEED");
    if (seed) for (const char *p = seed; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t s = h ^ ((uint64_t)(phys + 1) << 32);
    uint64_t a = splitmix(&s), b = splitmix(&s);
    memcpy(u->bytes, &a, 8);
    memcpy(u->bytes + 8, &b, 8);
}

static void uuid_str(const CUuuid *u, char *out) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* CUDA_VISIBLE_DEVICES: ordinals or GPU-<uuid prefix>; an invalid entry ends the list. */
static void parse_visible(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    CUuuid uu[MAX_DEVICES];
    for (int i = 0; i < cfg.nphys; i++) make_uuid(i, &uu[i]);
    if (!v) {
        cfg.ndev = cfg.nphys;
        for (int i = 0; i < cfg.nphys; i++) { devs[i].phys = i; devs[i].uuid = uu[i]; }
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    int used[MAX_DEVICES] = {0};
    cfg.ndev = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && cfg.ndev < MAX_DEVICES; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *e = tok + strlen(tok);
        while (e > tok && e[-1] == ' ') *--e = 0;
        int phys = -1;
        if (strncmp(tok, "GPU-", 4) == 0) {
            int matches = 0;
            for (int i = 0; i < cfg.nphys; i++) {
                char s[64];
                uuid_str(&uu[i], s);
                if (strlen(tok) > 4 && strncasecmp(s, tok, strlen(tok)) == 0) { phys = i; matches++; }
            }
            if (matches != 1) phys = -1;
        } else if (*tok) {
            char *end;
            long x = strtol(tok, &end, 10);
            if (*end == 0 && x >= 0 && x < cfg.nphys) phys = (int)x;
        }
        if (phys < 0 || used[phys]) break;
        used[phys] = 1;
        devs[cfg.ndev].phys = phys;
        devs[cfg.ndev].uuid = uu[phys];
        cfg.ndev++;
    }
}

/* ------------------------------------------------------------------ init */
static CUresult init_locked(void) {
    long long x;
    memset(&cfg, 0, sizeof cfg);
    memset(devs, 0, sizeof devs);
    env_long("CUDA_STANDIN_DEVICES", 0, &x);
    cfg.nphys = x > MAX_DEVICES ? MAX_DEVICES : (int)x;
    env_long("CUDA_STANDIN_TOTAL_BYTES", 8ll << 30, &x);
    cfg.total_bytes = (size_t)x;
    env_long("CUDA_STANDIN_GRANULARITY", 2ll << 20, &x);
    cfg.granularity = (size_t)x;
    if (cfg.granularity == 0 || (cfg.granularity & (cfg.granularity - 1)) || cfg.granularity % 4096) {
        note("cuInit: CUDA_STANDIN_GRANULARITY must be a power of two and a multiple of 4096; using 2 MiB");
        cfg.granularity = 2u << 20;
    }
    env_long("CUDA_STANDIN_STREAM_DELAY_MS", 20, &x);
    cfg.delay_ms = (long)x;
    env_long("CUDA_STANDIN_VMM", 1, &x);
    cfg.vmm = x != 0;
    env_long("CUDA_STANDIN_MEMSET_ASYNC", 0, &x);
    cfg.memset_async = x != 0;
    const char *d = getenv("CUDA_STANDIN_DIR");
    snprintf(cfg.dir, sizeof cfg.dir, "%s", d && *d ? d : "/dev/shm/cuda-standin");
    const char *l = getenv("CUDA_STANDIN_LOG");
    snprintf(cfg.log, sizeof cfg.log, "%s", l ? l : "");

    self_pid = (uint64_t)getpid();
    self_start = proc_start_time(getpid());
    struct stat st;
    self_pidns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;

    if (cfg.nphys == 0) return CUDA_ERROR_NO_DEVICE;
    parse_visible();
    if (cfg.ndev == 0) return CUDA_ERROR_NO_DEVICE;

    if (mkdir(cfg.dir, 01777) == 0) chmod(cfg.dir, 01777);
    else if (errno != EEXIST) {
        note("cuInit: cannot create state directory %s: %s", cfg.dir, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    if (ledger_open() != 0) return CUDA_ERROR_OPERATING_SYSTEM;
    sweep_dead_files();
    return CUDA_SUCCESS;
}

static CUresult init_rc;
EXPORT CUresult cuInit(unsigned flags) {
    if (flags != 0) return violation(CUDA_ERROR_INVALID_VALUE, "cuInit", "flags must be 0 (got %u)", flags);
    LOCK();
    if (initialized == 0) {
        init_rc = init_locked();
        initialized = init_rc == CUDA_SUCCESS ? 1 : -1;
    }
    CUresult rc = init_rc;
    UNLOCK();
    return rc;
}

CUresult need_init(const char *call) {
    if (initialized == 1) return CUDA_SUCCESS;
    return violation(CUDA_ERROR_NOT_INITIALIZED, call,
                     initialized == 0 ? "called before cuInit" : "cuInit failed (no stand-in device)");
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ devices */
int dev_valid(int d) { return d >= 0 && d < cfg.ndev; }

#define DEV_PROLOGUE(call, d)                                                                 \
    LOCK();                                                                                  \
    CUresult rc_ = need_init(call);                                                          \
    if (rc_) { UNLOCK(); return rc_; }                                                       \
    if (!dev_valid(d)) { UNLOCK(); return violation(CUDA_ERROR_INVALID_DEVICE, call, "device %d is not a valid ordinal (%d visible)", (int)(d), cfg.ndev); }

EXPORT CUresult cuDeviceGetCount(int *n) {
    LOCK();
    CUresult rc = need_init("cuDeviceGetCount");
    if (!rc) {
        if (!n) rc = violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount", "count pointer is NULL");
        else *n = cfg.ndev;
    }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    DEV_PROLOGUE("cuDeviceGet", ordinal);
    *d = ordinal;
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!name || len <= 0) return violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "name buffer is NULL or empty");
    DEV_PROLOGUE("cuDeviceGetName", d);
    snprintf(name, (size_t)len, "gpumemd stand-in device %d", devs[d].phys);
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    if (!u) return violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetUuid", "uuid pointer is NULL");
    DEV_PROLOGUE("cuDeviceGetUuid", d);
    *u = devs[d].uuid;
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (!bytes) return violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem_v2", "bytes pointer is NULL");
    DEV_PROLOGUE("cuDeviceTotalMem_v2", d);
    *bytes = cfg.total_bytes;
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
    note("cuDeviceTotalMem: is the pre-v2 entry point (32-bit size); call cuDeviceTotalMem_v2");
    return cuDeviceTotalMem_v2(bytes, d);
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice d) {
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    DEV_PROLOGUE("cuDeviceComputeCapability", d);
    *major = 9; *minor = 0;
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice d) {
    if (!bus || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    DEV_PROLOGUE("cuDeviceGetPCIBusId", d);
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x18 + devs[d].phys);
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    if (!v) return violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "value pointer is NULL");
    DEV_PROLOGUE("cuDeviceGetAttribute", d);
    int x = 0;
    switch (attr) {
    case 1: x = 1024; break;                 /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: x = 1024; break;
    case 4: x = 64; break;
    case 5: x = 2147483647; break;
    case 6: case 7: x = 65535; break;
    case 8: x = 49152; break;
    case 9: x = 65536; break;
    case 10: x = 32; break;                  /* WARP_SIZE */
    case 11: x = 2147483647; break;
    case 12: x = 65536; break;
    case 13: x = 1980000; break;             /* CLOCK_RATE kHz */
    case 14: x = 512; break;
    case 15: x = 1; break;
    case 16: x = 132; break;                 /* MULTIPROCESSOR_COUNT */
    case 19: x = 1; break;                   /* CAN_MAP_HOST_MEMORY */
    case 30: x = 512; break;
    case 31: case 32: x = 1; break;
    case 33: x = 0x18 + devs[d].phys; break; /* PCI_BUS_ID */
    case 34: x = 0; break;                   /* PCI_DEVICE_ID */
    case 36: x = 2619000; break;
    case 37: x = 5120; break;
    case 38: x = 52428800; break;
    case 39: x = 2048; break;
    case 40: x = 3; break;
    case 41: x = 1; break;                   /* UNIFIED_ADDRESSING */
    case 50: x = 0; break;                   /* PCI_DOMAIN_ID */
    case 75: x = 9; break;                   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: x = 0; break;
    case 78: case 79: case 80: x = 1; break;
    case 81: x = 233472; break;
    case 82: x = 65536; break;
    case 83: x = 1; break;
    case 89: case 90: x = 1; break;
    case 95: case 96: x = 1; break;
    case 97: x = 232448; break;
    case 99: x = 1; break;
    case 102: x = cfg.vmm; break;            /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    case 103: x = cfg.vmm; break;            /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    case 106: x = 32; break;
    case 110: x = cfg.vmm; break;
    case 111: x = 1024; break;
    case 112: case 113: case 115: x = 1; break;
    case 125: x = 1; break;                  /* IPC_EVENT_SUPPORTED */
    default:
        if (attr < 1 || attr > 134) {
            UNLOCK();
            return violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "unknown attribute %d", attr);
        }
        x = 0;
    }
    *v = x;
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    DEV_PROLOGUE("cuDeviceCanAccessPeer", d);
    if (!dev_valid(peer)) { UNLOCK(); return violation(CUDA_ERROR_INVALID_DEVICE, "cuDeviceCanAccessPeer", "peer %d is not a valid ordinal", peer); }
    *can = 0;   /* peer access is only proven on real GPUs */
    UNLOCK();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */
int ctx_valid(struct ctx *c) {
    for (struct ctx *x = all_ctx; x; x = x->next_all)
        if (x == c) return c->magic == STANDIN_MAGIC && c->alive;
    return 0;
}

static int ctx_known(struct ctx *c) {
    for (struct ctx *x = all_ctx; x; x = x->next_all)
        if (x == c) return 1;
    return 0;
}

CUresult need_ctx(const char *call, struct ctx **out) {
    CUresult rc = need_init(call);
    if (rc) return rc;
    struct ctx *c = tdepth > 0 ? tstack[tdepth - 1] : NULL;
    if (!c) return violation(CUDA_ERROR_INVALID_CONTEXT, call, "no CUDA context is current on this thread");
    if (!ctx_valid(c)) return violation(CUDA_ERROR_INVALID_CONTEXT, call, "the current context was destroyed (or its primary context released)");
    if (c->sticky) return violation(c->sticky, call, "the context has a sticky error from an earlier asynchronous fault");
    if (out) *out = c;
    return CUDA_SUCCESS;
}

static struct ctx *ctx_new(int dev, unsigned flags, int primary) {
    struct ctx *c = calloc(1, sizeof *c);
    c->magic = STANDIN_MAGIC;
    c->dev = dev;
    c->flags = flags;
    c->primary = primary;
    c->alive = 1;
    c->next_all = all_ctx;
    all_ctx = c;
    c->null_stream = stream_new(c, 0, 1);
    return c;
}

/* Destroys everything the context owns; the struct stays (poisoned) so stale handles are detected. */
static void ctx_teardown(struct ctx *c) {
    ctx_drain(c, 0);
    ctx_streams_teardown(c);
    mem_ctx_teardown(c);
    c->alive = 0;
    c->sticky = 0;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice d) {
    if (!pctx) return violation(CUDA_ERROR_INVALID_VALUE, "cuCtxCreate_v2", "context pointer is NULL");
    DEV_PROLOGUE("cuCtxCreate_v2", d);
    if (tdepth >= 64) { UNLOCK(); return violation(CUDA_ERROR_INVALID_VALUE, "cuCtxCreate_v2", "context stack is full"); }
    struct ctx *c = ctx_new(d, flags, 0);
    tstack[tdepth++] = c;
    *pctx = c;
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned flags, CUdevice d) {
    note("cuCtxCreate: is the pre-v2 entry point; call cuCtxCreate_v2");
    return cuCtxCreate_v2(pctx, flags, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    LOCK();
    CUresult rc = need_init("cuCtxDestroy_v2");
    if (!rc && !ctx_valid(c)) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy_v2", "not a live context (destroyed already?)");
    if (!rc && c->primary) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy_v2", "a primary context is released with cuDevicePrimaryCtxRelease, not destroyed");
    if (!rc) {
        ctx_teardown(c);
        if (tdepth > 0 && tstack[tdepth - 1] == c) tdepth--;
    }
    UNLOCK();
    return rc;
}
EXPORT CUresult cuCtxDestroy(CUcontext c) {
    note("cuCtxDestroy: is the pre-v2 entry point; call cuCtxDestroy_v2");
    return cuCtxDestroy_v2(c);
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    LOCK();
    CUresult rc = need_init("cuCtxPushCurrent_v2");
    if (!rc && !ctx_valid(c)) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent_v2", "not a live context");
    if (!rc && tdepth >= 64) rc = violation(CUDA_ERROR_INVALID_VALUE, "cuCtxPushCurrent_v2", "context stack is full");
    if (!rc) tstack[tdepth++] = c;
    UNLOCK();
    return rc;
}
EXPORT CUresult cuCtxPushCurrent(CUcontext c) {
    note("cuCtxPushCurrent: is the pre-v2 entry point; call cuCtxPushCurrent_v2");
    return cuCtxPushCurrent_v2(c);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pc) {
    LOCK();
    CUresult rc = need_init("cuCtxPopCurrent_v2");
    if (!rc && tdepth == 0) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent_v2", "the thread's context stack is empty");
    if (!rc) {
        struct ctx *c = tstack[--tdepth];
        if (pc) *pc = c;
    }
    UNLOCK();
    return rc;
}
EXPORT CUresult cuCtxPopCurrent(CUcontext *pc) {
    note("cuCtxPopCurrent: is the pre-v2 entry point; call cuCtxPopCurrent_v2");
    return cuCtxPopCurrent_v2(pc);
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    LOCK();
    CUresult rc = need_init("cuCtxSetCurrent");
    if (!rc && c && !ctx_valid(c)) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "not a live context");
    if (!rc) {
        if (!c) { if (tdepth > 0) tdepth--; }
        else if (tdepth == 0) tstack[tdepth++] = c;
        else tstack[tdepth - 1] = c;
    }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pc) {
    if (!pc) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult rc = need_init("cuCtxGetCurrent");
    if (!rc) *pc = tdepth > 0 ? tstack[tdepth - 1] : NULL;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx("cuCtxGetDevice", &c);
    if (!rc) *d = c->dev;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuCtxGetFlags(unsigned *f) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx("cuCtxGetFlags", &c);
    if (!rc) *f = c->flags;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuCtxGetApiVersion(CUcontext c, unsigned *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult rc = need_init("cuCtxGetApiVersion");
    if (!rc && c && !ctx_valid(c)) rc = violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxGetApiVersion", "not a live context");
    if (!rc) *v = 3020;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuCtxSynchronize(void) {
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx("cuCtxSynchronize", &c);
    if (!rc) {
        ctx_drain(c, 0);
        if (c->sticky) rc = c->sticky;
    }
    UNLOCK();
    return rc;
}

/* primary contexts */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice d) {
    if (!pc) return violation(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "context pointer is NULL");
    DEV_PROLOGUE("cuDevicePrimaryCtxRetain", d);
    struct device *dv = &devs[d];
    if (!dv->primary) dv->primary = ctx_new(d, dv->primary_flags, 1);
    else if (!dv->primary->alive) {
        dv->primary->alive = 1;
        dv->primary->flags = dv->primary_flags;
        dv->primary->null_stream = stream_new(dv->primary, 0, 1);
    }
    dv->primary_refs++;
    *pc = dv->primary;
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    DEV_PROLOGUE("cuDevicePrimaryCtxRelease_v2", d);
    struct device *dv = &devs[d];
    if (dv->primary_refs <= 0) {
        UNLOCK();
        return violation(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease_v2", "the primary context of device %d is not retained", d);
    }
    if (--dv->primary_refs == 0) ctx_teardown(dv->primary);
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    DEV_PROLOGUE("cuDevicePrimaryCtxReset_v2", d);
    struct device *dv = &devs[d];
    if (dv->primary && dv->primary->alive) {
        ctx_teardown(dv->primary);
        if (dv->primary_refs > 0) {     /* stays usable for the holders of a retain */
            dv->primary->alive = 1;
            dv->primary->null_stream = stream_new(dv->primary, 0, 1);
        }
    }
    dv->primary_flags = 0;
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    if (!flags || !active) return violation(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxGetState", "NULL output pointer");
    DEV_PROLOGUE("cuDevicePrimaryCtxGetState", d);
    *flags = devs[d].primary_flags;
    *active = devs[d].primary_refs > 0;
    UNLOCK();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned flags) {
    DEV_PROLOGUE("cuDevicePrimaryCtxSetFlags_v2", d);
    devs[d].primary_flags = flags;
    if (devs[d].primary && devs[d].primary->alive) devs[d].primary->flags = flags;
    UNLOCK();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned flags) { return cuDevicePrimaryCtxSetFlags_v2(d, flags); }

/* used by stream.c / mem.c when a handle names a context that once existed */
int ctx_was_known(struct ctx *c);
int ctx_was_known(struct ctx *c) { return ctx_known(c); }
