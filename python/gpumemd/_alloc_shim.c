/*
 * gpumemd allocator shim: the two C entry points that PyTorch's CUDAPluggableAllocator needs
 * (it dlopens a shared object and calls them by name), forwarding to gpumemd's Python client.
 *
 * Built by gpumemd/_shim.py with the system C compiler on first use and cached (see there).
 * It includes neither Python.h nor CUDA headers, so it builds without python3-dev or the CUDA
 * toolkit and one build serves every interpreter of the machine.
 *
 * SLOTS (64) allocator slots, each with its own pair of entry points (gpumemd_alloc_<n>,
 * gpumemd_free_<n>), so that several gpumemd allocators (clients, devices) live in one process:
 *
 *   alloc: calls the slot's callback, a ctypes CFUNCTYPE made by Python. ctypes takes the GIL
 *          for the call, under PyTorch's allocator lock (as vLLM's cumem allocator does); the
 *          callback leases from the daemon and returns the lease's pointer, or NULL (PyTorch
 *          then raises torch.cuda.OutOfMemoryError).
 *   free:  never calls Python. It appends (slot, ptr, size, device, stream) to a queue under
 *          this file's own mutex and returns; Python takes the queue with gpumemd_take_freed,
 *          which blocks without the GIL (ctypes releases it around foreign calls). So a free
 *          under PyTorch's allocator lock never waits for the GIL, which another thread may
 *          hold while it waits for that lock (the GIL -> allocator-lock order that PyTorch
 *          keeps; the reverse order is the classic deadlock).
 *
 * Thread-safe: callbacks are set before a slot is handed to PyTorch and read without a lock
 * afterwards (a slot's callback is set once); the queue is guarded by queue_lock, and
 * queue_lock is never held while calling anything else.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#define SLOTS 64 /* as many SLOT(n) lines at the end of the file */

typedef void *(*gpumemd_alloc_cb)(ssize_t size, int device, void *stream);

typedef struct {
    void *ptr;
    ssize_t size;
    int device;
    int slot;
    void *stream;
} gpumemd_freed;

static gpumemd_alloc_cb callbacks[SLOTS];
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER;
static gpumemd_freed *queue;
static size_t queue_len, queue_cap;
static unsigned long long lost_frees;     /* frees dropped because the queue could not grow */
static unsigned long long enqueued_total; /* frees queued since the start */

int gpumemd_slots(void) { return SLOTS; }

/* Sets a slot's allocation callback; 0, or -1 for a slot out of range. */
int gpumemd_set_alloc(int slot, gpumemd_alloc_cb cb) {
    if (slot < 0 || slot >= SLOTS) return -1;
    __atomic_store_n(&callbacks[slot], cb, __ATOMIC_RELEASE);
    return 0;
}

static void *alloc_in(int slot, ssize_t size, int device, void *stream) {
    gpumemd_alloc_cb cb = __atomic_load_n(&callbacks[slot], __ATOMIC_ACQUIRE);
    return cb == NULL ? NULL : cb(size, device, stream);
}

static void free_in(int slot, void *ptr, ssize_t size, int device, void *stream) {
    pthread_mutex_lock(&queue_lock);
    if (queue_len == queue_cap) {
        size_t cap = queue_cap == 0 ? 64 : queue_cap * 2;
        gpumemd_freed *grown = realloc(queue, cap * sizeof(*queue));
        if (grown == NULL) { /* the lease stays held until the session ends */
            lost_frees++;
            pthread_mutex_unlock(&queue_lock);
            return;
        }
        queue = grown;
        queue_cap = cap;
    }
    gpumemd_freed *f = &queue[queue_len++];
    f->ptr = ptr; f->size = size; f->device = device; f->slot = slot; f->stream = stream;
    enqueued_total++;
    pthread_cond_broadcast(&queue_cond);
    pthread_mutex_unlock(&queue_lock);
}

/*
 * Moves up to max queued frees, oldest first, into out; their number. With none queued it waits
 * up to wait_ms (negative: without end, 0: not at all).
 */
int gpumemd_take_freed(gpumemd_freed *out, int max, int wait_ms) {
    pthread_mutex_lock(&queue_lock);
    if (queue_len == 0 && wait_ms != 0) {
        if (wait_ms < 0) {
            while (queue_len == 0) pthread_cond_wait(&queue_cond, &queue_lock);
        } else {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += wait_ms / 1000;
            until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
            if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
            while (queue_len == 0) {
                if (pthread_cond_timedwait(&queue_cond, &queue_lock, &until) == ETIMEDOUT) break;
            }
        }
    }
    int n = 0;
    if (max > 0 && queue_len > 0) {
        n = queue_len < (size_t)max ? (int)queue_len : max;
        for (int i = 0; i < n; i++) out[i] = queue[i];
        for (size_t i = (size_t)n; i < queue_len; i++) queue[i - (size_t)n] = queue[i];
        queue_len -= (size_t)n;
    }
    pthread_mutex_unlock(&queue_lock);
    return n;
}

/* Frees queued now (for tests and diagnostics). */
int gpumemd_pending_frees(void) {
    pthread_mutex_lock(&queue_lock);
    int n = (int)queue_len;
    pthread_mutex_unlock(&queue_lock);
    return n;
}

/* Frees queued since the start: Python counts the ones it has handled, to wait for the rest. */
unsigned long long gpumemd_enqueued_total(void) {
    pthread_mutex_lock(&queue_lock);
    unsigned long long n = enqueued_total;
    pthread_mutex_unlock(&queue_lock);
    return n;
}

unsigned long long gpumemd_lost_frees(void) {
    pthread_mutex_lock(&queue_lock);
    unsigned long long n = lost_frees;
    pthread_mutex_unlock(&queue_lock);
    return n;
}

#define SLOT(n) \
    void *gpumemd_alloc_##n(ssize_t size, int device, void *stream) { return alloc_in(n, size, device, stream); } \
    void gpumemd_free_##n(void *ptr, ssize_t size, int device, void *stream) { free_in(n, ptr, size, device, stream); }

SLOT(0) SLOT(1) SLOT(2) SLOT(3) SLOT(4) SLOT(5) SLOT(6) SLOT(7)
SLOT(8) SLOT(9) SLOT(10) SLOT(11) SLOT(12) SLOT(13) SLOT(14) SLOT(15)
SLOT(16) SLOT(17) SLOT(18) SLOT(19) SLOT(20) SLOT(21) SLOT(22) SLOT(23)
SLOT(24) SLOT(25) SLOT(26) SLOT(27) SLOT(28) SLOT(29) SLOT(30) SLOT(31)
SLOT(32) SLOT(33) SLOT(34) SLOT(35) SLOT(36) SLOT(37) SLOT(38) SLOT(39)
SLOT(40) SLOT(41) SLOT(42) SLOT(43) SLOT(44) SLOT(45) SLOT(46) SLOT(47)
SLOT(48) SLOT(49) SLOT(50) SLOT(51) SLOT(52) SLOT(53) SLOT(54) SLOT(55)
SLOT(56) SLOT(57) SLOT(58) SLOT(59) SLOT(60) SLOT(61) SLOT(62) SLOT(63)
