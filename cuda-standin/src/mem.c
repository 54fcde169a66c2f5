/* Device memory: cuMemAlloc blocks, legacy IPC, the VMM family, copies and memsets,
 * host memory. Device memory is host memory: cuMemAlloc blocks are shared mappings of
 * files in CUDA_STANDIN_DIR (so another process, even of another uid, can open them
 * through a legacy IPC handle); VMM allocations are memfds (the exported POSIX fd is
 * the memfd itself, so SCM_RIGHTS carries it anywhere). */
#include "standin.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { AK_MEMALLOC = 1, AK_IPCOPEN, AK_VMM };

struct alloc {
    uint64_t magic;
    int alive;
    int kind;
    uint64_t kpid, kstart, kseq;     /* node-wide key */
    int dev, phys;
    size_t size, mapsize;
    uintptr_t base;                  /* AK_MEMALLOC / AK_IPCOPEN */
    struct ctx *ctx;
    int refs;                        /* AK_IPCOPEN open count */
    char path[600];                  /* AK_MEMALLOC backing file */
    int fd;                          /* AK_VMM memfd */
    int handle_refs, maps;           /* AK_VMM */
    int imported;                    /* AK_VMM: made here by cuMemImportFromShareableHandle, not cuMemCreate */
    CUmemAllocationProp prop;
    struct alloc *next;
};

struct resv { uintptr_t base; size_t size; int alive; struct resv *next; };
struct mapping {
    uintptr_t va;
    size_t size;
    struct alloc *a;
    struct resv *r;
    int acc[MAX_DEVICES];
    struct mapping *next;
};
struct hostmem { uintptr_t p; size_t size; int registered; struct hostmem *next; };

static struct alloc *allocs;
static struct resv *resvs;
static struct mapping *maps;
static struct hostmem *hosts;

static size_t page_round(size_t n) { return (n + 4095) & ~(size_t)4095; }

static struct alloc *find_block(uintptr_t p) {   /* live cuMemAlloc / IPC-opened block containing p */
    for (struct alloc *a = allocs; a; a = a->next)
        if (a->alive && a->kind != AK_VMM && p >= a->base && p < a->base + a->size) return a;
    return NULL;
}
static struct alloc *find_dead_block(uintptr_t p) {
    for (struct alloc *a = allocs; a; a = a->next)
        if (!a->alive && a->kind != AK_VMM && a->base == p) return a;
    return NULL;
}
static struct mapping *find_map(uintptr_t p) {
    for (struct mapping *m = maps; m; m = m->next)
        if (p >= m->va && p < m->va + m->size) return m;
    return NULL;
}
static struct mapping *find_map_at(uintptr_t p) {
    for (struct mapping *m = maps; m; m = m->next)
        if (m->va == p) return m;
    return NULL;
}
static struct alloc *find_handle(CUmemGenericAllocationHandle h) {
    for (struct alloc *a = allocs; a; a = a->next)
        if ((uintptr_t)a == (uintptr_t)h && a->kind == AK_VMM) return a;
    return NULL;
}
static int phys_to_dev(int phys) {
    for (int i = 0; i < cfg.ndev; i++) if (devs[i].phys == phys) return i;
    return -1;
}

CUresult check_range(uintptr_t p, size_t n, int need, int dev, const char **why) {
    struct alloc *a = find_block(p);
    if (a) {
        if (n > a->size - (p - a->base)) { *why = "the range runs past the end of the allocation"; return CUDA_ERROR_INVALID_VALUE; }
        return CUDA_SUCCESS;
    }
    struct mapping *m = find_map(p);
    if (!m) {
        *why = find_dead_block(p) ? "the pointer is device memory that was already freed"
                                  : "the pointer is not device memory of this process";
        return CUDA_ERROR_INVALID_VALUE;
    }
    uintptr_t cur = p, end = p + n;
    if (n == 0) end = p + 1;
    while (cur < end) {
        if (!m) { *why = "the range is not fully mapped (cuMemMap)"; return CUDA_ERROR_INVALID_VALUE; }
        int acc = dev >= 0 && dev < MAX_DEVICES ? m->acc[dev] : ACC_NONE;
        if (acc == ACC_NONE) { *why = "the range is mapped but has no access for this device (cuMemSetAccess not called, or PROT_NONE)"; return CUDA_ERROR_ILLEGAL_ADDRESS; }
        if (need == ACC_RW && acc != ACC_RW) { *why = "the range is mapped read-only (CU_MEM_ACCESS_FLAGS_PROT_READ) for this device"; return CUDA_ERROR_ILLEGAL_ADDRESS; }
        cur = m->va + m->size;
        if (cur < end) m = find_map_at(cur);
    }
    return CUDA_SUCCESS;
}

static int is_device_ptr(uintptr_t p) { return find_block(p) || find_map(p); }

/* ------------------------------------------------------------------ cuMemAlloc */
static void block_release(struct alloc *a) {
    munmap((void *)a->base, a->mapsize);
    if (a->kind == AK_MEMALLOC) unlink(a->path);
    ledger_drop(a->kpid, a->kstart, a->kseq);
    a->alive = 0;
}

void mem_ctx_teardown(struct ctx *c) {
    for (struct alloc *a = allocs; a; a = a->next)
        if (a->alive && a->kind != AK_VMM && a->ctx == c) block_release(a);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    const char *call = "cuMemAlloc_v2";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (!dptr) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "dptr is NULL"); goto out; }
    if (bytes == 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "bytesize is 0"); goto out; }
    struct alloc *a = calloc(1, sizeof *a);
    a->magic = STANDIN_MAGIC; a->kind = AK_MEMALLOC;
    a->kpid = self_pid; a->kstart = self_start; a->kseq = next_seq();
    a->dev = c->dev; a->phys = devs[c->dev].phys; a->ctx = c;
    a->size = bytes; a->mapsize = page_round(bytes);
    if (ledger_reserve(a->phys, bytes, a->kpid, a->kstart, a->kseq) != 0) {
        free(a);
        rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "%zu bytes do not fit: device %d has %zu of %zu bytes in use node-wide",
                       bytes, c->dev, ledger_used(devs[c->dev].phys), cfg.total_bytes);
        goto out;
    }
    snprintf(a->path, sizeof a->path, "%s/mem-%" PRIu64 "-%" PRIu64 "-%" PRIu64, cfg.dir, a->kpid, a->kstart, a->kseq);
    int fd = open(a->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    void *p = MAP_FAILED;
    if (fd >= 0) {
        fchmod(fd, 0666);
        if (ftruncate(fd, (off_t)a->mapsize) == 0)
            p = mmap(NULL, a->mapsize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (p == MAP_FAILED) {
        note("%s: cannot back %zu bytes with %s: %s", call, bytes, a->path, strerror(errno));
        unlink(a->path);
        ledger_drop(a->kpid, a->kstart, a->kseq);
        free(a);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    a->base = (uintptr_t)p;
    a->alive = 1;
    a->next = allocs; allocs = a;
    *dptr = a->base;
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytes) {
    note("cuMemAlloc: is the pre-v2 entry point (32-bit pointers); call cuMemAlloc_v2");
    return cuMemAlloc_v2(dptr, bytes);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    const char *call = "cuMemFree_v2";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    struct alloc *a = find_block(p);
    if (!a || a->kind != AK_MEMALLOC || a->base != p) {
        if (a && a->kind == AK_IPCOPEN) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx was opened with cuIpcOpenMemHandle; close it with cuIpcCloseMemHandle", p);
        else if (a) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is inside an allocation but not its base", p);
        else if (find_map(p)) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is VMM memory (cuMemUnmap/cuMemRelease)", p);
        else if (find_dead_block(p)) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx was freed already", p);
        else rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not device memory of this process", p);
        goto out;
    }
    ctx_drain(c, 0);                  /* cuMemFree synchronizes like the real driver */
    if (a->alive) block_release(a);
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemFree(CUdeviceptr p) {
    note("cuMemFree: is the pre-v2 entry point (32-bit pointers); call cuMemFree_v2");
    return cuMemFree_v2(p);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    const char *call = "cuMemGetAddressRange_v2";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    struct alloc *a = find_block(p);
    struct mapping *m = a ? NULL : find_map(p);
    if (a) { if (base) *base = a->base; if (size) *size = a->size; }
    else if (m) { if (base) *base = m->va; if (size) *size = m->size; }
    else rc = violation(CUDA_ERROR_NOT_FOUND, call, "0x%llx is not in any allocation of this process", p);
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    note("cuMemGetAddressRange: is the pre-v2 entry point (32-bit pointers); call cuMemGetAddressRange_v2");
    return cuMemGetAddressRange_v2(base, size, p);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    const char *call = "cuMemGetInfo_v2";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (!rc) {
        size_t used = ledger_used(devs[c->dev].phys);
        if (used > cfg.total_bytes) used = cfg.total_bytes;
        if (freeb) *freeb = cfg.total_bytes - used;
        if (total) *total = cfg.total_bytes;
    }
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemGetInfo(size_t *freeb, size_t *total) {
    note("cuMemGetInfo: is the pre-v2 entry point (32-bit sizes); call cuMemGetInfo_v2");
    return cuMemGetInfo_v2(freeb, total);
}

/* ------------------------------------------------------------------ memset / memcpy */
void do_memset(int kind, void *dst, uint32_t val, size_t n) {
    if (kind == IT_MEMSET8) memset(dst, (int)(val & 0xff), n);
    else if (kind == IT_MEMSET16) { uint16_t *d = dst, v = (uint16_t)val; for (size_t i = 0; i < n; i++) d[i] = v; }
    else { uint32_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = val; }
}

static CUresult bad_range(const char *call, CUresult rc, const char *what, uintptr_t p, size_t n, const char *why) {
    return violation(rc, call, "%s 0x%" PRIxPTR "+%zu: %s", what, p, n, why);
}

/* dst/src flags: 1 = device pointer that must be checked; -1 = decide (unified cuMemcpy) */
static CUresult copy_common(const char *call, uintptr_t dst, int ddev, uintptr_t src, int sdev, size_t n,
                            int kind, uint32_t val, CUstream hs, int async) {
    LOCK();
    struct ctx *c;
    const char *why;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (ddev < 0) ddev = is_device_ptr(dst);
    if (sdev < 0) sdev = is_device_ptr(src);
    size_t bytes = kind == IT_MEMSET16 ? n * 2 : kind == IT_MEMSET32 ? n * 4 : n;
    if (kind == IT_MEMSET16 && (dst & 1)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "destination 0x%" PRIxPTR " is not 2-byte aligned", dst); goto out; }
    if (kind == IT_MEMSET32 && (dst & 3)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "destination 0x%" PRIxPTR " is not 4-byte aligned", dst); goto out; }
    if (ddev && (rc = check_range(dst, bytes, ACC_RW, c->dev, &why))) { rc = bad_range(call, rc, "destination", dst, bytes, why); goto out; }
    if (kind == IT_COPY && sdev && (rc = check_range(src, bytes, ACC_READ, c->dev, &why))) { rc = bad_range(call, rc, "source", src, bytes, why); goto out; }
    if (!ddev && kind != IT_COPY) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR " is not device memory of this process", dst); goto out; }
    if (kind == IT_COPY && (!dst || !src)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "NULL pointer"); goto out; }
    if (!async && kind != IT_COPY && cfg.memset_async) async = 1;   /* as on a GPU: the memset lands later */
    if (async) {
        struct stream *s = stream_resolve(c, hs, call, &rc);
        if (!s) goto out;
        struct item *it = calloc(1, sizeof *it);
        it->kind = kind; it->call = call;
        it->dst = (void *)dst; it->src = (const void *)src; it->n = n; it->val = val;
        it->dst_dev = ddev; it->src_dev = sdev;
        rc = enqueue(s, it);
        goto out;
    }
    /* synchronous: the legacy default stream (and the blocking streams it syncs with) first */
    ctx_drain(c, 1);
    if (ddev && (rc = check_range(dst, bytes, ACC_RW, c->dev, &why))) { rc = bad_range(call, rc, "destination", dst, bytes, why); goto out; }
    if (kind == IT_COPY && sdev && (rc = check_range(src, bytes, ACC_READ, c->dev, &why))) { rc = bad_range(call, rc, "source", src, bytes, why); goto out; }
    if (kind == IT_COPY) memmove((void *)dst, (const void *)src, n);
    else do_memset(kind, (void *)dst, val, n);
out:
    UNLOCK();
    return rc;
}

#define PRE_V2(name) note(#name ": is the pre-v2 entry point (32-bit pointers); call " #name "_v2")

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return copy_common("cuMemsetD8_v2", d, 1, 0, 0, n, IT_MEMSET8, v, 0, 0); }
EXPORT CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { PRE_V2(cuMemsetD8); return copy_common("cuMemsetD8", d, 1, 0, 0, n, IT_MEMSET8, v, 0, 0); }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return copy_common("cuMemsetD16_v2", d, 1, 0, 0, n, IT_MEMSET16, v, 0, 0); }
EXPORT CUresult cuMemsetD16(CUdeviceptr d, unsigned short v, size_t n) { PRE_V2(cuMemsetD16); return copy_common("cuMemsetD16", d, 1, 0, 0, n, IT_MEMSET16, v, 0, 0); }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return copy_common("cuMemsetD32_v2", d, 1, 0, 0, n, IT_MEMSET32, v, 0, 0); }
EXPORT CUresult cuMemsetD32(CUdeviceptr d, unsigned v, size_t n) { PRE_V2(cuMemsetD32); return copy_common("cuMemsetD32", d, 1, 0, 0, n, IT_MEMSET32, v, 0, 0); }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return copy_common("cuMemsetD8Async", d, 1, 0, 0, n, IT_MEMSET8, v, s, 1); }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return copy_common("cuMemsetD16Async", d, 1, 0, 0, n, IT_MEMSET16, v, s, 1); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { return copy_common("cuMemsetD32Async", d, 1, 0, 0, n, IT_MEMSET32, v, s, 1); }

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy_common("cuMemcpyHtoD_v2", d, 1, (uintptr_t)h, 0, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) { PRE_V2(cuMemcpyHtoD); return copy_common("cuMemcpyHtoD", d, 1, (uintptr_t)h, 0, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy_common("cuMemcpyDtoH_v2", (uintptr_t)h, 0, d, 1, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) { PRE_V2(cuMemcpyDtoH); return copy_common("cuMemcpyDtoH", (uintptr_t)h, 0, d, 1, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy_common("cuMemcpyDtoD_v2", d, 1, s, 1, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { PRE_V2(cuMemcpyDtoD); return copy_common("cuMemcpyDtoD", d, 1, s, 1, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { return copy_common("cuMemcpyHtoDAsync_v2", d, 1, (uintptr_t)h, 0, n, IT_COPY, 0, s, 1); }
EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s) { PRE_V2(cuMemcpyHtoDAsync); return copy_common("cuMemcpyHtoDAsync", d, 1, (uintptr_t)h, 0, n, IT_COPY, 0, s, 1); }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { return copy_common("cuMemcpyDtoHAsync_v2", (uintptr_t)h, 0, d, 1, n, IT_COPY, 0, s, 1); }
EXPORT CUresult cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s) { PRE_V2(cuMemcpyDtoHAsync); return copy_common("cuMemcpyDtoHAsync", (uintptr_t)h, 0, d, 1, n, IT_COPY, 0, s, 1); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy_common("cuMemcpyDtoDAsync_v2", d, 1, s, 1, n, IT_COPY, 0, st, 1); }
EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { PRE_V2(cuMemcpyDtoDAsync); return copy_common("cuMemcpyDtoDAsync", d, 1, s, 1, n, IT_COPY, 0, st, 1); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy_common("cuMemcpy", d, -1, s, -1, n, IT_COPY, 0, 0, 0); }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy_common("cuMemcpyAsync", d, -1, s, -1, n, IT_COPY, 0, st, 1); }

/* ------------------------------------------------------------------ legacy IPC */
struct ipc_mem {                   /* the 64 bytes of a CUipcMemHandle */
    uint64_t magic;
    uint32_t kind, phys;
    uint64_t kpid, kstart, kseq, size, pidns, check;
};
_Static_assert(sizeof(struct ipc_mem) == 64, "ipc handle");
#define IPC_MEM_MAGIC 0x4d4d435049535343ULL

static uint64_t ipc_check(const struct ipc_mem *h) { return fnv1a(h, offsetof(struct ipc_mem, check)); }

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *out, CUdeviceptr p) {
    const char *call = "cuIpcGetMemHandle";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    if (!out) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle pointer is NULL"); goto out; }
    struct alloc *a = find_block(p);
    if (!a || a->kind != AK_MEMALLOC) {
        if (a) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx was itself opened from an IPC handle; only cuMemAlloc memory can be exported", p);
        else if (find_map(p)) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is VMM memory; export it with cuMemExportToShareableHandle", p);
        else rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not cuMemAlloc memory of this process", p);
        goto out;
    }
    if (a->base != p) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not the base of its allocation (base 0x%" PRIxPTR ")", p, a->base); goto out; }
    struct ipc_mem h = {IPC_MEM_MAGIC, 1, (uint32_t)a->phys, a->kpid, a->kstart, a->kseq, a->size, self_pidns, 0};
    h.check = ipc_check(&h);
    memcpy(out, &h, 64);
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned flags) {
    const char *call = "cuIpcOpenMemHandle_v2";
    LOCK();
    struct ctx *c;
    CUresult rc = need_ctx(call, &c);
    if (rc) goto out;
    if (!p) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "pointer is NULL"); goto out; }
    if (flags & ~1u) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x: only CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (1) is allowed", flags); goto out; }
    struct ipc_mem h;
    memcpy(&h, &handle, 64);
    if (h.magic != IPC_MEM_MAGIC || h.kind != 1 || h.check != ipc_check(&h)) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the 64 bytes are not a handle from cuIpcGetMemHandle");
        goto out;
    }
    if (h.pidns != self_pidns) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the handle was exported in another PID namespace (ns %" PRIu64 ", this process %" PRIu64 ")", h.pidns, self_pidns); goto out; }
    if (h.kpid == self_pid && h.kstart == self_start) { rc = violation(CUDA_ERROR_INVALID_CONTEXT, call, "the handle was exported by this same process (use the pointer itself)"); goto out; }
    if (!proc_alive(h.kpid, h.kstart)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the exporting process %" PRIu64 " has exited; its allocation is gone", h.kpid); goto out; }
    for (struct alloc *a = allocs; a; a = a->next) {
        if (!a->alive || a->kind != AK_IPCOPEN || a->kpid != h.kpid || a->kstart != h.kstart) continue;
        if (a->ctx == c && a->kseq == h.kseq) {   /* opened by this context already: one more reference */
            a->refs++;
            *p = a->base;
            goto out;
        }
        if (a->ctx != c && a->ctx->dev == c->dev && a->phys == (int)h.phys) {
            rc = violation(CUDA_ERROR_INVALID_CONTEXT, call,
                           "handles from process %" PRIu64 "'s device %u are already opened by another context on device %d of this process "
                           "(only one context per device may open them)", h.kpid, h.phys, c->dev);
            goto out;
        }
    }
    char path[600];
    snprintf(path, sizeof path, "%s/mem-%" PRIu64 "-%" PRIu64 "-%" PRIu64, cfg.dir, h.kpid, h.kstart, h.kseq);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the exported allocation was freed (%s)", strerror(errno)); goto out; }
    struct stat st;
    size_t mapsize = page_round(h.size);
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != mapsize) {
        close(fd);
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the backing file does not match the handle's size");
        goto out;
    }
    void *m = mmap(NULL, mapsize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) { rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap failed: %s", strerror(errno)); goto out; }
    struct alloc *a = calloc(1, sizeof *a);
    a->magic = STANDIN_MAGIC; a->kind = AK_IPCOPEN; a->alive = 1; a->refs = 1;
    a->kpid = h.kpid; a->kstart = h.kstart; a->kseq = h.kseq;
    a->phys = (int)h.phys; a->dev = phys_to_dev(a->phys); a->ctx = c;
    a->size = h.size; a->mapsize = mapsize; a->base = (uintptr_t)m;
    a->next = allocs; allocs = a;
    ledger_hold(a->kpid, a->kstart, a->kseq, a->phys, a->size);
    *p = a->base;
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned flags) {
    note("cuIpcOpenMemHandle: is the pre-v2 entry point; call cuIpcOpenMemHandle_v2");
    return cuIpcOpenMemHandle_v2(p, handle, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    const char *call = "cuIpcCloseMemHandle";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    struct alloc *a = find_block(p);
    if (!a || a->kind != AK_IPCOPEN || a->base != p) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not a pointer returned by cuIpcOpenMemHandle (closed already?)", p);
        goto out;
    }
    if (--a->refs == 0) block_release(a);
out:
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ VMM */
static CUresult vmm_gate(const char *call, int need_context) {
    CUresult rc = need_context ? need_ctx(call, NULL) : need_init(call);
    if (rc) return rc;
    if (!cfg.vmm) return violation(CUDA_ERROR_NOT_SUPPORTED, call, "virtual memory management is disabled (CUDA_STANDIN_VMM=0)");
    return CUDA_SUCCESS;
}

static CUresult check_prop(const char *call, const CUmemAllocationProp *p) {
    if (!p) return violation(CUDA_ERROR_INVALID_VALUE, call, "prop is NULL");
    if (p->type != 1) return violation(CUDA_ERROR_INVALID_VALUE, call, "prop.type %d is not CU_MEM_ALLOCATION_TYPE_PINNED (1)", p->type);
    if (p->location.type != 1) return violation(CUDA_ERROR_INVALID_VALUE, call, "prop.location.type %d is not CU_MEM_LOCATION_TYPE_DEVICE (1)", p->location.type);
    if (!dev_valid(p->location.id)) return violation(CUDA_ERROR_INVALID_DEVICE, call, "prop.location.id %d is not a valid device", p->location.id);
    if (p->requestedHandleTypes & 8) return violation(CUDA_ERROR_NOT_SUPPORTED, call, "CU_MEM_HANDLE_TYPE_FABRIC is not supported");
    if (p->requestedHandleTypes & ~1) return violation(CUDA_ERROR_INVALID_VALUE, call, "requestedHandleTypes 0x%x: only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1) exists on Linux", p->requestedHandleTypes);
    return CUDA_SUCCESS;
}

static void vmm_maybe_free(struct alloc *a) {
    if (!a->alive || a->handle_refs > 0 || a->maps > 0) return;
    close(a->fd);
    a->fd = -1;
    ledger_drop(a->kpid, a->kstart, a->kseq);
    a->alive = 0;
}

static struct alloc *live_handle(const char *call, CUmemGenericAllocationHandle h, CUresult *rc) {
    struct alloc *a = find_handle(h);
    if (!a || !a->alive || a->handle_refs <= 0) {
        *rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not a live allocation handle (released already?)", h);
        return NULL;
    }
    return a;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    const char *call = "cuMemGetAllocationGranularity";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    if (!rc && !g) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "granularity pointer is NULL");
    if (!rc) rc = check_prop(call, prop);
    if (!rc && option != 0 && option != 1) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "option %d is neither MINIMUM (0) nor RECOMMENDED (1)", option);
    if (!rc) *g = cfg.granularity;
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    const char *call = "cuMemCreate";
    LOCK();
    CUresult rc = vmm_gate(call, 1);
    if (rc) goto out;
    if (!h) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle pointer is NULL"); goto out; }
    if ((rc = check_prop(call, prop))) goto out;
    if (flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags must be 0"); goto out; }
    if (size == 0 || size % cfg.granularity) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "size %zu is not a positive multiple of the granularity %zu", size, cfg.granularity); goto out; }
    struct alloc *a = calloc(1, sizeof *a);
    a->magic = STANDIN_MAGIC; a->kind = AK_VMM;
    a->kpid = self_pid; a->kstart = self_start; a->kseq = next_seq();
    a->dev = prop->location.id; a->phys = devs[a->dev].phys;
    a->size = a->mapsize = size;
    a->prop = *prop;
    a->prop.win32HandleMetaData = NULL;
    if (ledger_reserve(a->phys, size, a->kpid, a->kstart, a->kseq) != 0) {
        free(a);
        rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "%zu bytes do not fit: device %d has %zu of %zu bytes in use node-wide",
                       size, prop->location.id, ledger_used(devs[prop->location.id].phys), cfg.total_bytes);
        goto out;
    }
    char name[200];
    snprintf(name, sizeof name, "cuda-standin-vmm:%" PRIu64 ":%" PRIu64 ":%" PRIu64 ":%d:%zu:%d",
             a->kpid, a->kstart, a->kseq, a->phys, size, prop->requestedHandleTypes);
    a->fd = memfd_create(name, MFD_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
        note("%s: memfd for %zu bytes failed: %s", call, size, strerror(errno));
        if (a->fd >= 0) close(a->fd);
        ledger_drop(a->kpid, a->kstart, a->kseq);
        free(a);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    a->alive = 1; a->handle_refs = 1;
    a->next = allocs; allocs = a;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    const char *call = "cuMemRelease";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    struct alloc *a = rc ? NULL : live_handle(call, h, &rc);
    if (a) { a->handle_refs--; vmm_maybe_free(a); }
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
    const char *call = "cuMemExportToShareableHandle";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    struct alloc *a = rc ? NULL : live_handle(call, h, &rc);
    if (!a) goto out;
    if (!out) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "output pointer is NULL"); goto out; }
    if (type != 1) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle type %d: only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1) is supported", type); goto out; }
    if (flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags must be 0"); goto out; }
    if (!(a->prop.requestedHandleTypes & 1)) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "the allocation was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes");
        goto out;
    }
    if (a->imported) {
        /* NVIDIA's driver exports only what this process created, and answers this code (an
         * H200, driver 580.159): a daemon that had taken its segments over handed none out */
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle 0x%llx was imported with cuMemImportFromShareableHandle: "
                       "only an allocation this process created with cuMemCreate can be exported", h);
        goto out;
    }
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) { rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "dup failed: %s", strerror(errno)); goto out; }
    *(int *)out = fd;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
    const char *call = "cuMemImportFromShareableHandle";
    LOCK();
    CUresult rc = vmm_gate(call, 1);
    if (rc) goto out;
    if (!h) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle pointer is NULL"); goto out; }
    if (type != 1) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "handle type %d: only CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1) is supported", type); goto out; }
    int fd = (int)(intptr_t)os;
    char lp[64], target[512];
    snprintf(lp, sizeof lp, "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(lp, target, sizeof target - 1) : -1;
    if (n < 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "%d is not an open file descriptor", fd); goto out; }
    target[n] = 0;
    uint64_t kpid, kstart, kseq;
    int phys, htypes;
    size_t size;
    if (sscanf(target, "/memfd:cuda-standin-vmm:%" SCNu64 ":%" SCNu64 ":%" SCNu64 ":%d:%zu:%d", &kpid, &kstart, &kseq, &phys, &size, &htypes) != 6) {
        rc = violation(CUDA_ERROR_INVALID_VALUE, call, "descriptor %d (%s) is not a stand-in allocation exported by cuMemExportToShareableHandle", fd, target);
        goto out;
    }
    for (struct alloc *a = allocs; a; a = a->next)
        if (a->alive && a->kind == AK_VMM && a->kpid == kpid && a->kstart == kstart && a->kseq == kseq) {
            a->handle_refs++;
            *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
            goto out;
        }
    int dev = phys_to_dev(phys);
    if (dev < 0) { rc = violation(CUDA_ERROR_INVALID_DEVICE, call, "the allocation lives on physical device %d, which is not visible to this process", phys); goto out; }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "descriptor %d does not have the allocation's size", fd); goto out; }
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);   /* the caller keeps its descriptor */
    if (mine < 0) { rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "dup failed: %s", strerror(errno)); goto out; }
    struct alloc *a = calloc(1, sizeof *a);
    a->magic = STANDIN_MAGIC; a->kind = AK_VMM; a->alive = 1; a->handle_refs = 1; a->imported = 1;
    a->kpid = kpid; a->kstart = kstart; a->kseq = kseq;
    a->dev = dev; a->phys = phys; a->size = a->mapsize = size; a->fd = mine;
    a->prop.type = 1; a->prop.requestedHandleTypes = htypes; a->prop.location.type = 1; a->prop.location.id = dev;
    a->next = allocs; allocs = a;
    ledger_hold(kpid, kstart, kseq, phys, size);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    const char *call = "cuMemAddressReserve";
    LOCK();
    CUresult rc = vmm_gate(call, 1);
    if (rc) goto out;
    (void)addr;   /* a hint; the stand-in lets the kernel choose */
    if (!p) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "pointer is NULL"); goto out; }
    if (flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags must be 0"); goto out; }
    if (size == 0 || size % cfg.granularity) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "size %zu is not a positive multiple of the granularity %zu", size, cfg.granularity); goto out; }
    if (align == 0) align = cfg.granularity;
    if (align % cfg.granularity || (align & (align - 1))) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "alignment %zu is not a power-of-two multiple of the granularity %zu", align, cfg.granularity); goto out; }
    void *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "no address space for %zu bytes", size); goto out; }
    uintptr_t b = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
    if (b > (uintptr_t)m) munmap(m, b - (uintptr_t)m);
    uintptr_t end = (uintptr_t)m + size + align;
    if (end > b + size) munmap((void *)(b + size), end - (b + size));
    struct resv *r = calloc(1, sizeof *r);
    r->base = b; r->size = size; r->alive = 1;
    r->next = resvs; resvs = r;
    *p = b;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    const char *call = "cuMemAddressFree";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    if (rc) goto out;
    struct resv *r = resvs;
    while (r && !(r->alive && r->base == p)) r = r->next;
    if (!r || r->size != size) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx+%zu is not a whole reservation from cuMemAddressReserve", p, size); goto out; }
    for (struct mapping *m = maps; m; m = m->next)
        if (m->r == r) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR "+%zu inside the reservation is still mapped (cuMemUnmap first)", m->va, m->size); goto out; }
    munmap((void *)r->base, r->size);
    r->alive = 0;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    const char *call = "cuMemMap";
    LOCK();
    CUresult rc = vmm_gate(call, 1);
    struct alloc *a = rc ? NULL : live_handle(call, h, &rc);
    if (!a) goto out;
    if (flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "flags must be 0"); goto out; }
    if (offset != 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "offset %zu: the offset into the allocation must be 0", offset); goto out; }
    if (size == 0 || size % cfg.granularity) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "size %zu is not a positive multiple of the granularity %zu", size, cfg.granularity); goto out; }
    if (size > a->size) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "size %zu exceeds the allocation's %zu bytes", size, a->size); goto out; }
    struct resv *r = resvs;
    while (r && !(r->alive && p >= r->base && p < r->base + r->size)) r = r->next;
    if (!r || size > r->base + r->size - p) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx+%zu is not inside one reservation from cuMemAddressReserve", p, size); goto out; }
    for (struct mapping *m = maps; m; m = m->next)
        if (p < m->va + m->size && m->va < p + size) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx+%zu overlaps the mapping at 0x%" PRIxPTR "+%zu", p, size, m->va, m->size); goto out; }
    void *x = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0);
    if (x == MAP_FAILED) { rc = violation(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap failed: %s", strerror(errno)); goto out; }
    struct mapping *m = calloc(1, sizeof *m);
    m->va = p; m->size = size; m->a = a; m->r = r;
    m->next = maps; maps = m;
    a->maps++;
out:
    UNLOCK();
    return rc;
}

/* [p, p+size) must be exactly a run of whole, adjacent mappings. */
static CUresult whole_mappings(const char *call, uintptr_t p, size_t size, struct mapping **first) {
    struct mapping *m = find_map_at(p);
    if (!m) {
        if (find_map(p)) return violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR " is inside a mapping, not at its start", p);
        return violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR "+%zu is not mapped (cuMemMap)", p, size);
    }
    *first = m;
    uintptr_t cur = p, end = p + size;
    if (size == 0) return violation(CUDA_ERROR_INVALID_VALUE, call, "size is 0");
    while (cur < end) {
        if (!m) return violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR "+%zu is not fully mapped (gap at 0x%" PRIxPTR ")", p, size, cur);
        cur = m->va + m->size;
        if (cur > end) return violation(CUDA_ERROR_INVALID_VALUE, call, "0x%" PRIxPTR "+%zu ends inside the mapping at 0x%" PRIxPTR "+%zu", p, size, m->va, m->size);
        if (cur < end) m = find_map_at(cur);
    }
    return CUDA_SUCCESS;
}

static void apply_prot(struct mapping *m) {
    int best = ACC_NONE;
    for (int i = 0; i < MAX_DEVICES; i++) if (m->acc[i] > best) best = m->acc[i];
    int prot = best == ACC_RW ? PROT_READ | PROT_WRITE : best == ACC_READ ? PROT_READ : PROT_NONE;
    mprotect((void *)m->va, m->size, prot);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    const char *call = "cuMemSetAccess";
    LOCK();
    CUresult rc = vmm_gate(call, 1);
    if (rc) goto out;
    if (!desc || count == 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "no access descriptors"); goto out; }
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != 1) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "desc[%zu].location.type %d is not CU_MEM_LOCATION_TYPE_DEVICE (1)", i, desc[i].location.type); goto out; }
        if (!dev_valid(desc[i].location.id)) { rc = violation(CUDA_ERROR_INVALID_DEVICE, call, "desc[%zu].location.id %d is not a valid device", i, desc[i].location.id); goto out; }
        int f = desc[i].flags;
        if (f != ACC_NONE && f != ACC_READ && f != ACC_RW) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "desc[%zu].flags %d is not PROT_NONE (0), PROT_READ (1) or PROT_READWRITE (3)", i, f); goto out; }
    }
    struct mapping *m;
    if ((rc = whole_mappings(call, p, size, &m))) goto out;
    uintptr_t cur = p, end = p + size;
    while (cur < end) {
        for (size_t i = 0; i < count; i++) m->acc[desc[i].location.id] = desc[i].flags;
        apply_prot(m);
        cur = m->va + m->size;
        if (cur < end) m = find_map_at(cur);
    }
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    const char *call = "cuMemUnmap";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    struct mapping *m;
    if (rc || (rc = whole_mappings(call, p, size, &m))) goto out;
    uintptr_t cur = p, end = p + size;
    while (cur < end) {
        m = find_map_at(cur);
        cur = m->va + m->size;
        mmap((void *)m->va, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        struct mapping **pp = &maps;
        while (*pp != m) pp = &(*pp)->next;
        *pp = m->next;
        m->a->maps--;
        vmm_maybe_free(m->a);
        free(m);
    }
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr p) {
    const char *call = "cuMemGetAccess";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    if (rc) goto out;
    if (!flags || !loc) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "NULL argument"); goto out; }
    if (loc->type != 1 || !dev_valid(loc->id)) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "location is not a valid device"); goto out; }
    struct mapping *m = find_map(p);
    if (!m) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not mapped", p); goto out; }
    *flags = (unsigned long long)m->acc[loc->id];
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    const char *call = "cuMemRetainAllocationHandle";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    if (rc) goto out;
    struct mapping *m = find_map((uintptr_t)addr);
    if (!h || !m) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "%p is not in a range mapped by cuMemMap", addr); goto out; }
    m->a->handle_refs++;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)m->a;
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    const char *call = "cuMemGetAllocationPropertiesFromHandle";
    LOCK();
    CUresult rc = vmm_gate(call, 0);
    struct alloc *a = rc ? NULL : live_handle(call, h, &rc);
    if (a && !prop) rc = violation(CUDA_ERROR_INVALID_VALUE, call, "prop is NULL");
    else if (a) *prop = a->prop;
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ host memory */
static CUresult host_alloc(const char *call, void **pp, size_t size) {
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    if (!pp || size == 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "NULL pointer or size 0"); goto out; }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { rc = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    struct hostmem *h = calloc(1, sizeof *h);
    h->p = (uintptr_t)m; h->size = size;
    h->next = hosts; hosts = h;
    *pp = m;
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags) { (void)flags; return host_alloc("cuMemHostAlloc", pp, size); }
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) { return host_alloc("cuMemAllocHost_v2", pp, size); }

EXPORT CUresult cuMemFreeHost(void *p) {
    const char *call = "cuMemFreeHost";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    struct hostmem **pp = &hosts;
    while (*pp && !((*pp)->p == (uintptr_t)p && !(*pp)->registered)) pp = &(*pp)->next;
    if (!*pp) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "%p is not from cuMemHostAlloc/cuMemAllocHost", p); goto out; }
    struct hostmem *h = *pp;
    *pp = h->next;
    munmap((void *)h->p, h->size);
    free(h);
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    const char *call = "cuMemHostRegister_v2";
    (void)flags;
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    if (!p || size == 0) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "NULL pointer or size 0"); goto out; }
    for (struct hostmem *h = hosts; h; h = h->next)
        if ((uintptr_t)p < h->p + h->size && h->p < (uintptr_t)p + size) {
            rc = violation(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, call, "%p+%zu overlaps registered or pinned host memory", p, size);
            goto out;
        }
    struct hostmem *h = calloc(1, sizeof *h);
    h->p = (uintptr_t)p; h->size = size; h->registered = 1;
    h->next = hosts; hosts = h;
out:
    UNLOCK();
    return rc;
}
EXPORT CUresult cuMemHostRegister(void *p, size_t size, unsigned flags) { return cuMemHostRegister_v2(p, size, flags); }

EXPORT CUresult cuMemHostUnregister(void *p) {
    const char *call = "cuMemHostUnregister";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    struct hostmem **pp = &hosts;
    while (*pp && !((*pp)->p == (uintptr_t)p && (*pp)->registered)) pp = &(*pp)->next;
    if (!*pp) { rc = violation(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, call, "%p was not registered with cuMemHostRegister", p); goto out; }
    struct hostmem *h = *pp;
    *pp = h->next;
    free(h);
out:
    UNLOCK();
    return rc;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    const char *call = "cuMemHostGetDevicePointer_v2";
    LOCK();
    CUresult rc = need_ctx(call, NULL);
    if (rc) goto out;
    if (!d || flags) { rc = violation(CUDA_ERROR_INVALID_VALUE, call, "NULL pointer or flags not 0"); goto out; }
    for (struct hostmem *h = hosts; h; h = h->next)
        if ((uintptr_t)p >= h->p && (uintptr_t)p < h->p + h->size) { *d = (uintptr_t)p; goto out; }
    rc = violation(CUDA_ERROR_INVALID_VALUE, call, "%p is not pinned or registered host memory", p);
out:
    UNLOCK();
    return rc;
}

/* ------------------------------------------------------------------ state-directory hygiene */
void sweep_dead_files(void) {
    DIR *d = opendir(cfg.dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t pid, start, seq;
        if (sscanf(e->d_name, "mem-%" SCNu64 "-%" SCNu64 "-%" SCNu64, &pid, &start, &seq) == 3 ||
            sscanf(e->d_name, "ev-%" SCNu64 "-%" SCNu64 "-%" SCNu64, &pid, &start, &seq) == 3) {
            if (!proc_alive(pid, start)) unlinkat(dirfd(d), e->d_name, 0);
        }
    }
    closedir(d);
}

void mem_exit_cleanup(void);
void mem_exit_cleanup(void) {
    for (struct alloc *a = allocs; a; a = a->next) {
        if (a->alive && a->kind == AK_MEMALLOC) unlink(a->path);
        if (a->alive) ledger_drop(a->kpid, a->kstart, a->kseq);
    }
}
