/* Node-wide memory ledger: a shared file in CUDA_STANDIN_DIR with one entry per
 * (allocation, holder process). An allocation counts as used on its device while
 * any live holder has an entry for it; holders are identified by pid and process
 * start time (/proc/PID/stat field 22), so a SIGKILLed holder stops counting.
 * Updates take an flock on the file (released by the kernel if a holder dies),
 * and every caller already holds the process-wide driver lock G. */
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEDGER_ENTRIES 16384
#define LEDGER_MAGIC 0x315244474c4e5343ULL

struct lentry {
    uint64_t kpid, kstart, kseq;   /* allocation key: creator pid, start time, sequence */
    uint64_t size;
    uint64_t hpid, hstart;         /* holder */
    uint32_t phys, used;
    uint64_t pad;
};
struct ledger {
    uint64_t magic;
    uint64_t hi;          /* entries at or above this index are unused */
    uint64_t pad[6];
    struct lentry e[LEDGER_ENTRIES];
};

static struct ledger *L;
static int lfd = -1;

int ledger_open(void) {
    if (L) return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/ledger", cfg.dir);
    lfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lfd < 0) { note("cuInit: cannot open ledger %s: %s", path, strerror(errno)); return -1; }
    fchmod(lfd, 0666);
    flock(lfd, LOCK_EX);
    struct stat st;
    if (fstat(lfd, &st) == 0 && (size_t)st.st_size < sizeof(struct ledger)) {
        if (ftruncate(lfd, sizeof(struct ledger)) != 0) {
            note("cuInit: cannot size ledger %s: %s", path, strerror(errno));
            flock(lfd, LOCK_UN);
            return -1;
        }
    }
    void *p = mmap(NULL, sizeof(struct ledger), PROT_READ | PROT_WRITE, MAP_SHARED, lfd, 0);
    if (p == MAP_FAILED) { note("cuInit: cannot map ledger: %s", strerror(errno)); flock(lfd, LOCK_UN); return -1; }
    L = p;
    if (L->magic != LEDGER_MAGIC) { memset(L, 0, sizeof(struct ledger)); L->magic = LEDGER_MAGIC; }
    flock(lfd, LOCK_UN);
    return 0;
}

/* liveness cache for one scan */
struct lcache { uint64_t pid, start; int alive; };
static int holder_alive(struct lcache *c, int *nc, uint64_t pid, uint64_t start) {
    if (pid == self_pid && start == self_start) return 1;
    for (int i = 0; i < *nc; i++)
        if (c[i].pid == pid && c[i].start == start) return c[i].alive;
    int a = proc_alive(pid, start);
    if (*nc < 256) { c[*nc].pid = pid; c[*nc].start = start; c[*nc].alive = a; (*nc)++; }
    return a;
}

static size_t used_locked(int phys) {
    struct lcache cache[256];
    int nc = 0, nseen = 0;
    size_t total = 0;
    uint64_t hi = L->hi > LEDGER_ENTRIES ? LEDGER_ENTRIES : L->hi, last = 0;
    static struct lentry *seen[LEDGER_ENTRIES];   /* G is held: one scan at a time */
    for (uint64_t i = 0; i < hi; i++) {
        struct lentry *e = &L->e[i];
        if (!e->used) continue;
        if (!holder_alive(cache, &nc, e->hpid, e->hstart)) { memset(e, 0, sizeof *e); continue; }
        last = i + 1;
        if ((int)e->phys != phys) continue;
        int dup = 0;   /* count each allocation once, however many holders */
        for (int j = 0; j < nseen && !dup; j++)
            dup = seen[j]->kpid == e->kpid && seen[j]->kstart == e->kstart && seen[j]->kseq == e->kseq;
        if (!dup) { total += e->size; seen[nseen++] = e; }
    }
    L->hi = last;
    return total;
}

static int hold_locked(uint64_t kpid, uint64_t kstart, uint64_t kseq, int phys, size_t size) {
    int free_slot = -1;
    uint64_t hi = L->hi > LEDGER_ENTRIES ? LEDGER_ENTRIES : L->hi;
    for (int i = 0; i < (int)hi; i++) {
        struct lentry *e = &L->e[i];
        if (!e->used) { if (free_slot < 0) free_slot = i; continue; }
        if (e->kpid == kpid && e->kstart == kstart && e->kseq == kseq && e->hpid == self_pid && e->hstart == self_start)
            return 0;   /* this process holds it already */
    }
    if (free_slot < 0 && hi >= LEDGER_ENTRIES) {   /* full: drop entries of dead holders and retry once */
        used_locked(-1);
        for (int i = 0; i < LEDGER_ENTRIES && free_slot < 0; i++) if (!L->e[i].used) free_slot = i;
        if (free_slot < 0) return -1;
    }
    if (free_slot < 0) free_slot = (int)hi;
    if ((uint64_t)free_slot >= L->hi) L->hi = free_slot + 1;
    struct lentry *e = &L->e[free_slot];
    e->kpid = kpid; e->kstart = kstart; e->kseq = kseq; e->size = size;
    e->hpid = self_pid; e->hstart = self_start; e->phys = (uint32_t)phys;
    __atomic_store_n(&e->used, 1, __ATOMIC_RELEASE);
    return 0;
}

int ledger_hold(uint64_t kpid, uint64_t kstart, uint64_t kseq, int phys, size_t size) {
    if (!L) return 0;
    flock(lfd, LOCK_EX);
    int r = hold_locked(kpid, kstart, kseq, phys, size);
    flock(lfd, LOCK_UN);
    if (r) note("ledger full (%d entries): allocation not counted in cuMemGetInfo", LEDGER_ENTRIES);
    return r;
}

int ledger_reserve(int phys, size_t size, uint64_t kpid, uint64_t kstart, uint64_t kseq) {
    if (!L) return 0;
    flock(lfd, LOCK_EX);
    size_t used = used_locked(phys);
    int r = 0;
    if (used > cfg.total_bytes || size > cfg.total_bytes - used) r = -1;
    else hold_locked(kpid, kstart, kseq, phys, size);
    flock(lfd, LOCK_UN);
    return r;
}

void ledger_drop(uint64_t kpid, uint64_t kstart, uint64_t kseq) {
    if (!L) return;
    flock(lfd, LOCK_EX);
    uint64_t hi = L->hi > LEDGER_ENTRIES ? LEDGER_ENTRIES : L->hi;
    for (uint64_t i = 0; i < hi; i++) {
        struct lentry *e = &L->e[i];
        if (e->used && e->kpid == kpid && e->kstart == kstart && e->kseq == kseq && e->hpid == self_pid && e->hstart == self_start)
            memset(e, 0, sizeof *e);
    }
    flock(lfd, LOCK_UN);
}

size_t ledger_used(int phys) {
    if (!L) return 0;
    flock(lfd, LOCK_EX);
    size_t u = used_locked(phys);
    flock(lfd, LOCK_UN);
    return u;
}
