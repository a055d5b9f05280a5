/*
 * preflight's CPU stand-in for libcuda.so.1 and libnccl.so.2, built by the
 * tests (tests/common/standin.rs) and never shipped.
 *
 * It exports the subset of the CUDA driver API and of NCCL's C API that
 * crates/nccl-sys loads, with the real signatures: NCCL's from nccl.h of
 * the nvidia-nccl-cu12 2.32.3 wheel that tests/setup/collective-libs.sh
 * fetches (when the header is there the build includes it, so the compiler
 * holds every definition below to NCCL's own prototype), the driver API's
 * from the CUDA 12.4 documentation (cuda.h is not in any wheel the tests
 * fetch: the prototypes are written out below, `_v2` where cuda.h's macros
 * select it for 64-bit device pointers). One library answers to both
 * names (the tests link libcuda.so.1 and libnccl.so.2 to it), so NCCL
 * sees the driver's allocations as the real one sees device memory.
 *
 * What it does as the real libraries do:
 * - Devices: PREFLIGHT_STANDIN_DEVICES of them (default 8; 0 makes cuInit
 *   answer CUDA_ERROR_NO_DEVICE, as a driver without GPUs does).
 * - Device memory is host memory behind opaque device addresses that no
 *   host pointer can be: a host pointer passed where a device pointer is
 *   required fails as NCCL's pointer check fails ("AllReduce : sendbuff
 *   0x... is not a valid pointer", ncclInvalidArgument); a copy outside an
 *   allocation fails with CUDA_ERROR_INVALID_VALUE.
 * - Streams are queues run in order by one thread each; cuStreamQuery says
 *   CUDA_ERROR_NOT_READY while work is queued; cuMemcpy and cuMemFree wait
 *   for the context's blocking streams first (cuMemFree for all), as the
 *   legacy default stream and the driver's implicit synchronisation do: a
 *   CU_STREAM_NON_BLOCKING stream is not waited for by a copy.
 * - Communicators: the unique id carries the bootstrap root's address (a
 *   listener of the process that called ncclGetUniqueId); ranks connect to
 *   it, learn each other's addresses, and connect pairwise over loopback
 *   TCP. ncclCommInitRankConfig with blocking = 0 returns ncclInProgress
 *   and ncclCommGetAsyncError reports ncclInProgress until the
 *   communicator is ready, then ncclSuccess or the error; operations are
 *   queued on the caller's stream; a non-blocking communicator's first
 *   operation returns ncclInProgress while it "connects" (see submit); a
 *   send moves no data before its peer's recv is posted (CH_CTS), so send
 *   and recv outside a group deadlock as in NCCL; ncclGroupStart/End batch
 *   send/recv;
 *   ncclCommAbort unblocks every wait of the communicator (its init, its
 *   queued operations) at once, and a later call on an aborted or
 *   destroyed communicator aborts the process (NCCL has freed it); errors
 *   come with ncclGetLastError text.
 * - NCCL_DEBUG=INFO writes NCCL-style lines ("host:pid:tid [dev] NCCL INFO
 *   ...") to NCCL_DEBUG_FILE (%h and %p expanded as NCCL does), among them
 *   the network choice lines crates/preflight-collective/src/nccl/transport.rs reads, in
 *   the form of the real logs it cites (NVIDIA/nccl issues 226, 941, 1053).
 *
 * Fault switches, read only here:
 *   PREFLIGHT_STANDIN_INIT_HANG=R        rank R never completes init
 *   PREFLIGHT_STANDIN_HANG=R:BYTES       rank R's operations above BYTES never complete
 *   PREFLIGHT_STANDIN_CORRUPT=R:BYTES    rank R's results from BYTES on are wrong (one element)
 *   PREFLIGHT_STANDIN_ASYNC_ERROR=R:BYTES rank R fails with ncclRemoteError from BYTES on
 *   PREFLIGHT_STANDIN_NET=socket|ib|ib-fallback
 *                                        the network the INFO lines say was chosen
 *                                        (ib-fallback: "NET/IB : No device found.", then Socket)
 *   PREFLIGHT_STANDIN_DEVICES=N          the device count
 *   PREFLIGHT_STANDIN_HOST=NAME          added to the host name NCCL's duplicate-GPU check
 *                                        compares (two ranks on one host and one device
 *                                        fail init with ncclInvalidUsage, as in NCCL)
 *
 * Copies (copies.c): pinned host memory, asynchronous copies and fills,
 * events, host functions and PCI bus ids, with each copy's time modelled from its link:
 *   PREFLIGHT_STANDIN_HOST_GBPS=G        host<->device rate (GB/s, default 24)
 *   PREFLIGHT_STANDIN_D2D_GBPS=G         device-to-device rate (default 1000)
 *   PREFLIGHT_STANDIN_SLOW_GPU=D:F[,..]  device D copies at F times the rate
 *   PREFLIGHT_STANDIN_UPLINK=N:G[:K]     every N devices (only group K) share one G GB/s uplink
 *   PREFLIGHT_STANDIN_COPY_HANG=D        device D's copies never complete
 *   PREFLIGHT_STANDIN_QUEUE_PAUSE_US=N   the host thread pauses N µs before each asynchronous
 *                                        copy and event record (a loaded node's host)
 *   PREFLIGHT_STANDIN_BAD_BYTE=D:OFFSET  device D's byte at OFFSET (from its first
 *                                        allocation's address) has bit 4 stuck at 1
 *   PREFLIGHT_STANDIN_BUS_IDS=A,B,...    the devices' PCI addresses
 *   PREFLIGHT_STANDIN_MEMORY=BYTES       memory per device
 *
 * Kernels (kernels.c): the memory test's pattern kernels, run on the CPU by
 * name from the PTX text they are loaded from, with the stuck bit and the
 * hang above.
 *
 * What it cannot be: a GPU. Any other kernel, NVLink, the IB transport
 * itself, device memory faults and real bandwidth are not here.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef STANDIN_NCCL_H
#include <nccl.h>
#else
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
    ncclTimeout = 8, ncclNumResults = 9
} ncclResult_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct standin_config ncclConfig_t;
#endif

#define EXPORT __attribute__((visibility("default")))
#define STANDIN_VERSION 23203 /* the version of the nccl.h it is built against */

/* ---- the CUDA driver API's types (cuda.h, CUDA 12.4) ---------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_INVALID_IMAGE = 200, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_ILLEGAL_ADDRESS = 700
};

/* ---- logging, NCCL's way --------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;
static int log_level = -1; /* 0 none, 1 WARN, 2 INFO */
static __thread int log_dev;

static void log_open(void) {
    if (log_level >= 0) return;
    const char *lvl = getenv("NCCL_DEBUG");
    log_level = 0;
    if (lvl && (!strcasecmp(lvl, "INFO") || !strcasecmp(lvl, "TRACE"))) log_level = 2;
    else if (lvl && !strcasecmp(lvl, "WARN")) log_level = 1;
    if (log_level == 0) return;
    const char *pattern = getenv("NCCL_DEBUG_FILE");
    if (!pattern) { log_file = stdout; return; }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char *dot = strchr(host, '.');
    if (dot) *dot = 0;
    char path[4096];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 64 < sizeof path; p++) {
        if (*p != '%') { path[o++] = *p; continue; }
        p++;
        if (*p == 'h') o += snprintf(path + o, sizeof path - o, "%s", host);
        else if (*p == 'p') o += snprintf(path + o, sizeof path - o, "%d", (int)getpid());
        else if (*p == '%') path[o++] = '%';
        else if (*p == 0) { path[o++] = '%'; break; }
        else { path[o++] = '%'; path[o++] = *p; }
    }
    path[o] = 0;
    log_file = fopen(path, "w");
    if (log_file) setvbuf(log_file, NULL, _IOLBF, 0);
}

static void say(int level, const char *fmt, ...) {
    pthread_mutex_lock(&log_lock);
    log_open();
    if (log_level >= level && log_file) {
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        char *dot = strchr(host, '.');
        if (dot) *dot = 0;
        fprintf(log_file, "%s:%d:%ld [%d] NCCL %s ", host, (int)getpid(), (long)syscall(SYS_gettid),
                log_dev, level == 1 ? "WARN" : "INFO");
        va_list ap;
        va_start(ap, fmt);
        vfprintf(log_file, fmt, ap);
        va_end(ap);
        fputc('\n', log_file);
    }
    pthread_mutex_unlock(&log_lock);
}
#define INFO(...) say(2, __VA_ARGS__)

/* ncclGetLastError's text: the last failure's, as NCCL keeps it. */
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

static ncclResult_t fail(ncclResult_t code, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&last_lock);
    snprintf(last_error, sizeof last_error, "%s", text);
    pthread_mutex_unlock(&last_lock);
    say(1, "%s", text);
    return code;
}

/* RANK or RANK:BYTES from a fault switch; -1 when unset. */
static int fault(const char *var, long *bytes) {
    const char *v = getenv(var);
    if (!v || !*v) return -1;
    char *end;
    long r = strtol(v, &end, 10);
    if (bytes) *bytes = (*end == ':') ? strtol(end + 1, NULL, 10) : 0;
    return (int)r;
}

/* ---- devices, contexts, memory ------------------------------------------------ */

#define MAX_DEVICES 64
#define MAX_STREAMS 256

struct op;

struct CUstream_st {
    struct CUctx_st *ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct op *head, *tail;
    int running, destroyed;
    unsigned int flags; /* CU_STREAM_NON_BLOCKING (1): no implicit sync with the legacy stream */
    double vclock;      /* the modelled time its last copy or event ended (copies.c) */
};

struct CUctx_st {
    int dev, retained;
    struct CUstream_st *streams[MAX_STREAMS];
    int nstreams;
};

struct allocation {
    CUdeviceptr addr;
    size_t size;
    unsigned char *host;
    int dev, live;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static struct CUctx_st g_ctx[MAX_DEVICES];
static struct allocation *g_allocs;
static size_t g_nallocs, g_cap;
static CUdeviceptr g_next[MAX_DEVICES];
static __thread struct CUctx_st *g_current;

static int device_count(void) {
    const char *v = getenv("PREFLIGHT_STANDIN_DEVICES");
    int n = v && *v ? atoi(v) : 8;
    return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

/* Device addresses: 0x7e00'0000'0000 + 64 GiB per device, never a host
 * address this process could hand out (the range is kept out of reach by
 * being looked up, never dereferenced). */
static CUdeviceptr device_base(int dev) { return 0x7e0000000000ULL + ((CUdeviceptr)dev << 36); }

/* The allocation holding [ptr, ptr + len), or NULL. Call with g_lock. */
static struct allocation *find(CUdeviceptr ptr, size_t len) {
    for (size_t i = 0; i < g_nallocs; i++) {
        struct allocation *a = &g_allocs[i];
        if (a->live && ptr >= a->addr && ptr - a->addr <= a->size && len <= a->size - (ptr - a->addr))
            return a;
    }
    return NULL;
}

/* Host memory behind a device pointer, or NULL. */
static unsigned char *host_of(const void *ptr, size_t len, int *dev) {
    pthread_mutex_lock(&g_lock);
    struct allocation *a = find((CUdeviceptr)(uintptr_t)ptr, len);
    unsigned char *h = a ? a->host + ((CUdeviceptr)(uintptr_t)ptr - a->addr) : NULL;
    if (a && dev) *dev = a->dev;
    pthread_mutex_unlock(&g_lock);
    return h;
}

static void stream_wait_idle(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head || s->running) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the context's streams: all of them (cuCtxSynchronize, and
 * cuMemFree, which synchronises the device), or, for the synchronous
 * copies that run on the legacy default stream, only the blocking ones: a
 * CU_STREAM_NON_BLOCKING stream's work is not waited for, as in CUDA, so
 * a copy made without waiting on such a stream reads what is there. */
static void ctx_sync_streams(struct CUctx_st *c, int legacy_only) {
    pthread_mutex_lock(&g_lock);
    int n = c->nstreams;
    struct CUstream_st *list[MAX_STREAMS];
    memcpy(list, c->streams, sizeof(list[0]) * (size_t)n);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++)
        if (!(legacy_only && (list[i]->flags & 1))) stream_wait_idle(list[i]);
}

static void ctx_sync(struct CUctx_st *c) { ctx_sync_streams(c, 0); }

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        for (int d = 0; d < MAX_DEVICES; d++) {
            g_ctx[d].dev = d;
            g_next[d] = device_base(d);
        }
        g_inited = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    *count = device_count();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "preflight CPU stand-in %d", dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_ctx[dev].retained++;
    pthread_mutex_unlock(&g_lock);
    *pctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    int ok = g_ctx[dev].retained > 0;
    if (ok) g_ctx[dev].retained--;
    pthread_mutex_unlock(&g_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx && (ctx < &g_ctx[0] || ctx >= &g_ctx[MAX_DEVICES])) return CUDA_ERROR_INVALID_CONTEXT;
    g_current = ctx;
    log_dev = ctx ? ctx->dev : 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_sync(g_current);
    return CUDA_SUCCESS;
}

/* PREFLIGHT_STANDIN_MEMORY bytes per device (default 48 GiB), at most 60
 * GiB: a device's addresses span 64 GiB (device_base). An allocation
 * past it fails as the driver's does. */
static size_t device_memory(void) {
    const char *v = getenv("PREFLIGHT_STANDIN_MEMORY");
    size_t most = (size_t)60 << 30;
    size_t n = v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)48 << 30;
    return n < most ? n : most;
}

static size_t device_used(int dev) {
    size_t used = 0;
    for (size_t i = 0; i < g_nallocs; i++)
        if (g_allocs[i].live && g_allocs[i].dev == dev) used += g_allocs[i].size;
    return used;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes > device_memory()) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned char *host = calloc(1, bytes);
    if (!host) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    /* Checked and taken under one lock: two callers cannot both fit. */
    if (device_used(g_current->dev) > device_memory() - bytes) {
        pthread_mutex_unlock(&g_lock);
        free(host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (g_nallocs == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 64;
        struct allocation *grown = realloc(g_allocs, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            free(host);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_allocs = grown;
        g_cap = cap;
    }
    int dev = g_current->dev;
    CUdeviceptr addr = g_next[dev];
    /* 256-byte aligned as cudaMalloc's are, with a gap after each so that an
     * overrun lands outside every allocation. */
    g_next[dev] += (bytes + 511) & ~(CUdeviceptr)255;
    g_allocs[g_nallocs++] = (struct allocation){addr, bytes, host, dev, 1};
    pthread_mutex_unlock(&g_lock);
    *dptr = addr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    /* Freeing synchronises: work queued on the buffer finishes first. */
    ctx_sync(g_current);
    pthread_mutex_lock(&g_lock);
    struct allocation *a = find(dptr, 0);
    int ok = a && a->addr == dptr;
    if (ok) {
        a->live = 0;
        free(a->host);
        a->host = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!src && bytes) return CUDA_ERROR_INVALID_VALUE;
    ctx_sync_streams(g_current, 1);
    unsigned char *h = host_of((const void *)(uintptr_t)dst, bytes, NULL);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    memcpy(h, src, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!dst && bytes) return CUDA_ERROR_INVALID_VALUE;
    ctx_sync_streams(g_current, 1);
    unsigned char *h = host_of((const void *)(uintptr_t)src, bytes, NULL);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, h, bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    size_t used = device_used(g_current->dev);
    pthread_mutex_unlock(&g_lock);
    *total = device_memory();
    *free_bytes = used < *total ? *total - used : 0;
    return CUDA_SUCCESS;
}

static void run_op(struct op *op);

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        struct op *op = s->head;
        s->head = *(struct op **)op; /* op->next is its first field */
        if (!s->head) s->tail = NULL;
        s->running = 1;
        pthread_mutex_unlock(&s->mu);
        run_op(op);
        pthread_mutex_lock(&s->mu);
        s->running = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    /* Destroyed and drained: only now out of its context's list, so that
     * cuCtxSynchronize and cuMemFree wait for a destroyed stream's queued
     * work as the driver does. */
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c = s->ctx;
    for (int i = 0; i < c->nstreams; i++)
        if (c->streams[i] == s) c->streams[i] = c->streams[--c->nstreams];
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
    if (!ps || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = g_current;
    s->flags = flags;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&g_lock);
    if (g_current->nstreams == MAX_STREAMS) {
        pthread_mutex_unlock(&g_lock);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_current->streams[g_current->nstreams++] = s;
    pthread_mutex_unlock(&g_lock);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_detach(s->thread);
    *ps = s;
    return CUDA_SUCCESS;
}

static int known_stream(struct CUstream_st *s) {
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (int d = 0; d < MAX_DEVICES && !found; d++)
        for (int i = 0; i < g_ctx[d].nstreams; i++)
            if (g_ctx[d].streams[i] == s) found = 1;
    pthread_mutex_unlock(&g_lock);
    return found;
}

EXPORT CUresult cuStreamQuery(CUstream s) {
    if (!s || !known_stream(s) || s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    int busy = s->head || s->running;
    pthread_mutex_unlock(&s->mu);
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    if (!s || !known_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    /* As the driver: returns at once; queued work still runs (and is
     * still waited for by the context), then the stream goes. */
    pthread_mutex_lock(&s->mu);
    if (s->destroyed) {
        pthread_mutex_unlock(&s->mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s->destroyed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_READY: *text = "device not ready"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_INVALID_IMAGE: *text = "device kernel image is invalid"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    default: *text = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- communicators ------------------------------------------------------------ */

#define MAX_RANKS 512
#define ID_MAGIC 0x50465349u /* "PFSI" */
/* CH_CTS: a recv, once it runs, tells its peer it is posted ("clear to
 * send"); a send waits for that before its data moves, as NCCL's does (its
 * proxy cannot move data into a buffer not yet posted), so that send and
 * recv outside a group deadlock as they do in NCCL. */
enum { CH_COLL = 0, CH_P2P = 1, CH_CTS = 2 };

struct msg {
    struct msg *next;
    uint32_t chan;
    uint64_t seq;
    size_t len;
    unsigned char data[];
};

struct ncclComm {
    int rank, nranks, dev;
    uint64_t tag;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    volatile int async;   /* what ncclCommGetAsyncError reports */
    volatile int aborted;
    int listener, boot;
    int fd[MAX_RANKS];
    pthread_mutex_t send_mu[MAX_RANKS];
    struct msg *box[MAX_RANKS];
    int gone[MAX_RANKS];
    uint64_t coll_seq, send_seq[MAX_RANKS], recv_seq[MAX_RANKS];
    int pending;
    struct sockaddr_in root;
    int blocking;  /* 0: made by ncclCommInitRankConfig with blocking = 0 */
    int connected; /* the first operation has "connected" (non-blocking: ncclInProgress once) */
    int dead;      /* aborted or destroyed: NCCL has freed it; any later call is a use after free */
};

struct op {
    struct op *next; /* first: the stream's queue links through it */
    int kind;
    struct ncclComm *comm;
    const void *send;
    void *recv;
    size_t count;
    int dt, redop, peer;
    uint64_t seq;
    struct op *group; /* OP_GROUP: its operations, in order */
    int cts_sent;     /* OP_RECV: its clear-to-send already went (a group sends them all first) */
    void (*call)(void *); /* OP_CALL: the stream runs call(arg) (copies.c) */
    void *arg;
};
enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_SEND, OP_RECV, OP_GROUP, OP_CALL };

static size_t dt_size(int dt) {
    switch (dt) {
    case 0: case 1: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    default: return 0;
    }
}

static int write_all(int fd, const void *buf, size_t len) {
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    unsigned char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int listen_loopback(struct sockaddr_in *at) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, MAX_RANKS) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        close(fd);
        return -1;
    }
    *at = a;
    return fd;
}

static int connect_to(const struct sockaddr_in *at) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)at, sizeof *at)) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The bootstrap root: collects every rank's address, then connects back
 * to each rank's listener with the whole table, as NCCL's root does (a
 * rank keeps no connection to the root: should the root's process end, the
 * ranks still waiting simply wait, until their own deadline and abort).
 * Lives in the process that made the unique id. */
/* A rank as the table lists it: where it listens, and its GPU (the host
 * and device that NCCL's duplicate check compares). */
struct peer { struct sockaddr_in addr; int32_t dev; uint64_t host; };
struct hello { uint64_t tag; int32_t rank, nranks; struct peer me; };
struct who { uint64_t tag; int32_t rank; }; /* rank -1: the root, with the table */
struct root_arg { int fd; uint64_t tag; };

static void *root_main(void *p) {
    struct root_arg arg = *(struct root_arg *)p;
    free(p);
    static __thread struct peer table[MAX_RANKS];
    int seen[MAX_RANKS] = {0};
    int have = 0, nranks = -1;
    while (nranks < 0 || have < nranks) {
        int c = accept4(arg.fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR) continue;
            break;
        }
        struct hello h;
        int ok = !read_all(c, &h, sizeof h) && h.tag == arg.tag && h.nranks >= 1 && h.nranks <= MAX_RANKS &&
                 h.rank >= 0 && h.rank < h.nranks && (nranks < 0 || h.nranks == nranks) && !seen[h.rank];
        close(c);
        if (!ok) continue;
        nranks = h.nranks;
        seen[h.rank] = 1;
        table[h.rank] = h.me;
        have++;
    }
    close(arg.fd);
    for (int r = 0; r < nranks && have == nranks; r++) {
        int fd = connect_to(&table[r].addr);
        struct who w = {arg.tag, -1};
        if (fd < 0) continue;
        write_all(fd, &w, sizeof w);
        write_all(fd, table, sizeof table[0] * (size_t)nranks);
        close(fd);
    }
    return NULL;
}

EXPORT ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion : version argument is NULL");
    *version = STANDIN_VERSION;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
    if (!out) return fail(ncclInvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL");
    struct root_arg *arg = malloc(sizeof *arg);
    struct sockaddr_in at;
    if (!arg) return ncclSystemError;
    arg->fd = listen_loopback(&at);
    if (arg->fd < 0) {
        free(arg);
        return fail(ncclSystemError, "Bootstrap : cannot listen: %s", strerror(errno));
    }
    uint64_t tag = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)arg ^ (uint64_t)at.sin_port;
    arg->tag = tag;
    pthread_t t;
    if (pthread_create(&t, NULL, root_main, arg)) {
        close(arg->fd);
        free(arg);
        return fail(ncclSystemError, "Bootstrap : cannot start the root thread");
    }
    pthread_detach(t);
    memset(out, 0, sizeof *out);
    uint32_t magic = ID_MAGIC;
    memcpy(out->internal, &magic, 4);
    memcpy(out->internal + 4, &tag, 8);
    memcpy(out->internal + 12, &at, sizeof at);
    INFO("Bootstrap: Using lo:127.0.0.1<0>");
    return ncclSuccess;
}

static void set_error(struct ncclComm *c, ncclResult_t code) {
    pthread_mutex_lock(&c->mu);
    if (c->async == ncclSuccess || c->async == ncclInProgress) c->async = code;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

struct recv_arg { struct ncclComm *c; int peer; };

static void *receiver_main(void *p) {
    struct recv_arg a = *(struct recv_arg *)p;
    free(p);
    struct ncclComm *c = a.c;
    for (;;) {
        struct { uint32_t chan; uint64_t seq; uint64_t len; } h;
        if (read_all(c->fd[a.peer], &h, sizeof h)) break;
        struct msg *m = malloc(sizeof *m + h.len);
        if (!m || (h.len && read_all(c->fd[a.peer], m->data, h.len))) {
            free(m);
            break;
        }
        m->chan = h.chan;
        m->seq = h.seq;
        m->len = h.len;
        m->next = NULL;
        pthread_mutex_lock(&c->mu);
        struct msg **tail = &c->box[a.peer];
        while (*tail) tail = &(*tail)->next;
        *tail = m;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    c->gone[a.peer] = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* This host, as NCCL's hostHash tells hosts apart: its name (and
 * PREFLIGHT_STANDIN_HOST, so that a test can play several hosts). */
static uint64_t host_hash(void) {
    char name[256] = {0};
    gethostname(name, sizeof name - 1);
    const char *extra = getenv("PREFLIGHT_STANDIN_HOST");
    uint64_t h = 1469598103934665603ull;
    for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    for (const char *s = extra ? extra : ""; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void hang_until_abort(struct ncclComm *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->aborted) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* As NCCL's init.cc does once every rank's info is in: two ranks on one
 * host and one device is ncclInvalidUsage, with NCCL's text. Ranks
 * without a duplicate of their own wait, as NCCL's do, until their
 * deadline. */
static ncclResult_t duplicate_gpu(struct ncclComm *c, const struct peer *table) {
    for (int p = 0; p < c->nranks; p++)
        if (p != c->rank && table[p].host == table[c->rank].host && table[p].dev == table[c->rank].dev)
            return fail(ncclInvalidUsage, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %x",
                        c->rank, p, 0x1000 * (c->dev + 1));
    return ncclSuccess;
}

static ncclResult_t init_comm(struct ncclComm *c) {
    if (fault("PREFLIGHT_STANDIN_INIT_HANG", NULL) == c->rank) {
        hang_until_abort(c);
        return fail(ncclInternalError, "Init : rank %d aborted during init", c->rank);
    }
    struct sockaddr_in mine;
    c->listener = listen_loopback(&mine);
    if (c->listener < 0) return fail(ncclSystemError, "Init : cannot listen: %s", strerror(errno));
    int boot = -1;
    while (boot < 0 && !c->aborted) {
        boot = connect_to(&c->root);
        if (boot < 0) usleep(10000);
    }
    if (c->aborted) return fail(ncclInternalError, "Init : aborted");
    struct hello h = {c->tag, c->rank, c->nranks, {mine, c->dev, host_hash()}};
    int sent = write_all(boot, &h, sizeof h);
    close(boot);
    if (sent) return fail(ncclRemoteError, "Bootstrap : the root closed the connection");
    /* The table comes from the root on this rank's listener; a higher rank
     * that got it first may connect before it does. */
    struct peer *table = calloc((size_t)c->nranks, sizeof *table);
    if (!table) return ncclSystemError;
    int have_table = 0, accepted = 0;
    while (!have_table || accepted < c->nranks - 1 - c->rank) {
        int fd = accept4(c->listener, NULL, NULL, SOCK_CLOEXEC);
        struct who w;
        if (fd < 0) {
            free(table);
            return c->aborted ? fail(ncclInternalError, "Init : aborted")
                              : fail(ncclSystemError, "Init : accept: %s", strerror(errno));
        }
        if (read_all(fd, &w, sizeof w) || w.tag != c->tag) { close(fd); continue; }
        if (w.rank == -1 && !have_table) {
            have_table = !read_all(fd, table, sizeof *table * (size_t)c->nranks);
            close(fd);
            ncclResult_t dup = have_table ? duplicate_gpu(c, table) : ncclSuccess;
            if (dup != ncclSuccess) {
                free(table);
                return dup;
            }
        } else if (w.rank > c->rank && w.rank < c->nranks && c->fd[w.rank] < 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            c->fd[w.rank] = fd;
            accepted++;
        } else {
            close(fd);
        }
    }
    for (int p = 0; p < c->rank; p++) {
        int fd = -1;
        while (fd < 0 && !c->aborted) {
            fd = connect_to(&table[p].addr);
            if (fd < 0) usleep(10000);
        }
        struct who w = {c->tag, c->rank};
        if (fd < 0 || write_all(fd, &w, sizeof w)) {
            free(table);
            return c->aborted ? fail(ncclInternalError, "Init : aborted")
                              : fail(ncclRemoteError, "Init : cannot connect to rank %d", p);
        }
        c->fd[p] = fd;
    }
    free(table);
    for (int p = 0; p < c->nranks; p++) {
        if (p == c->rank) continue;
        struct recv_arg *a = malloc(sizeof *a);
        pthread_t t;
        if (!a) return ncclSystemError;
        *a = (struct recv_arg){c, p};
        if (pthread_create(&t, NULL, receiver_main, a)) return ncclSystemError;
        pthread_detach(t);
    }
    const char *net = getenv("PREFLIGHT_STANDIN_NET");
    log_dev = c->dev;
    INFO("cudaDriverVersion 12040");
    INFO("NCCL version 2.32.3+cuda12.4 (preflight CPU stand-in)");
    if (net && !strcmp(net, "ib")) {
        INFO("NET/IB : Using [0]mlx5_0:1/IB ; OOB lo:127.0.0.1<0>");
        INFO("Using network IB");
    } else {
        if (net && !strcmp(net, "ib-fallback")) INFO("NET/IB : No device found.");
        INFO("NET/Socket : Using [0]lo:127.0.0.1<0>");
        INFO("Using network Socket");
    }
    INFO("comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %x commId 0x%llx - Init COMPLETE", (void *)c,
         c->rank, c->nranks, c->dev, c->dev, 0x1000 * (c->dev + 1), (unsigned long long)c->tag);
    return ncclSuccess;
}

static void *init_main(void *p) {
    struct ncclComm *c = p;
    ncclResult_t r = init_comm(c);
    pthread_mutex_lock(&c->mu);
    if (c->async == ncclInProgress) c->async = r;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* The part of ncclConfig_t every version since 2.14 begins with. */
struct config_head { size_t size; unsigned int magic, version; int blocking; };

static ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, int blocking) {
    if (!out) return fail(ncclInvalidArgument, "CommInitRank : comm argument is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
    uint32_t magic;
    memcpy(&magic, id.internal, 4);
    if (magic != ID_MAGIC) return fail(ncclInvalidArgument, "CommInitRank : the unique id was not made by ncclGetUniqueId");
    if (!g_current) return fail(ncclUnhandledCudaError, "Cuda failure 'invalid device context': no current CUDA context");
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = g_current->dev;
    memcpy(&c->tag, id.internal + 4, 8);
    memcpy(&c->root, id.internal + 12, sizeof c->root);
    c->listener = c->boot = -1;
    for (int i = 0; i < MAX_RANKS; i++) {
        c->fd[i] = -1;
        pthread_mutex_init(&c->send_mu[i], NULL);
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->async = ncclInProgress;
    c->blocking = blocking;
    *out = c;
    if (blocking) {
        ncclResult_t r = init_comm(c);
        c->async = r;
        return r;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, init_main, c)) return fail(ncclSystemError, "Init : cannot start a thread");
    pthread_detach(t);
    return ncclInProgress;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init_rank(comm, nranks, commId, rank, 1);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
    int blocking = 1;
    if (config) {
        const struct config_head *h = (const void *)config;
        if (h->magic != 0xcafebeef || h->size < sizeof *h)
            return fail(ncclInvalidArgument, "Invalid config: magic %x size %zu", h->magic, h->size);
        if (h->blocking != INT_MIN) blocking = h->blocking != 0;
    }
    return init_rank(comm, nranks, commId, rank, blocking);
}

/* NCCL frees an aborted or destroyed communicator: a later call on it is a
 * use after free, which here ends the process loudly instead of passing. */
static void alive(const struct ncclComm *c, const char *fn) {
    if (c && c->dead) {
        fprintf(stderr, "preflight NCCL stand-in: %s on a communicator already aborted or destroyed (NCCL has freed it: a use after free)\n", fn);
        abort();
    }
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    alive(comm, "ncclCommGetAsyncError");
    if (!comm || !asyncError) return fail(ncclInvalidArgument, "CommGetAsyncError : comm or asyncError is NULL");
    *asyncError = (ncclResult_t)comm->async;
    return ncclSuccess;
}

static void cut(struct ncclComm *c) {
    for (int p = 0; p < c->nranks; p++)
        if (c->fd[p] >= 0) shutdown(c->fd[p], SHUT_RDWR);
    if (c->listener >= 0) shutdown(c->listener, SHUT_RDWR);
    if (c->boot >= 0) shutdown(c->boot, SHUT_RDWR);
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    alive(comm, "ncclCommAbort");
    comm->dead = 1;
    pthread_mutex_lock(&comm->mu);
    comm->aborted = 1;
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
    cut(comm);
    /* The communicator's memory stays: its queued operations, now
     * cancelled, may still be reading it on their streams. */
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    alive(comm, "ncclCommDestroy");
    comm->dead = 1;
    pthread_mutex_lock(&comm->mu);
    while (comm->pending > 0 && !comm->aborted) pthread_cond_wait(&comm->cv, &comm->mu);
    comm->aborted = 1;
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
    cut(comm);
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t code) {
    switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
    alive(comm, "ncclGetLastError");
    return last_error;
}

/* ---- operations ------------------------------------------------------------------ */

static int send_msg(struct ncclComm *c, int peer, uint32_t chan, uint64_t seq, const void *data, size_t len) {
    if (peer == c->rank) {
        struct msg *m = malloc(sizeof *m + len);
        if (!m) return -1;
        *m = (struct msg){NULL, chan, seq, len};
        memcpy(m->data, data, len);
        pthread_mutex_lock(&c->mu);
        struct msg **tail = &c->box[peer];
        while (*tail) tail = &(*tail)->next;
        *tail = m;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    struct { uint32_t chan; uint64_t seq; uint64_t len; } h = {chan, seq, len};
    pthread_mutex_lock(&c->send_mu[peer]);
    int r = write_all(c->fd[peer], &h, sizeof h) || write_all(c->fd[peer], data, len) ? -1 : 0;
    pthread_mutex_unlock(&c->send_mu[peer]);
    return r;
}

/* The message from `peer` on `chan` numbered `seq`: waits for it until the
 * communicator is aborted or fails, or the peer's connection ends. */
static ncclResult_t take(struct ncclComm *c, int peer, uint32_t chan, uint64_t seq, struct msg **out) {
    pthread_mutex_lock(&c->mu);
    for (;;) {
        for (struct msg **pm = &c->box[peer]; *pm; pm = &(*pm)->next) {
            if ((*pm)->chan == chan && (*pm)->seq == seq) {
                *out = *pm;
                *pm = (*pm)->next;
                pthread_mutex_unlock(&c->mu);
                return ncclSuccess;
            }
        }
        if (c->aborted || (c->async != ncclSuccess && c->async != ncclInProgress)) {
            pthread_mutex_unlock(&c->mu);
            return ncclInternalError;
        }
        if (c->gone[peer]) {
            pthread_mutex_unlock(&c->mu);
            return fail(ncclRemoteError, "NET/Socket : socketProgress: Connection closed by remote peer rank %d (127.0.0.1)", peer);
        }
        pthread_cond_wait(&c->cv, &c->mu);
    }
}

#define REDUCE(T)                                                                    \
    do {                                                                             \
        T *a = (T *)acc;                                                             \
        const T *b = (const T *)in;                                                  \
        for (size_t i = 0; i < n; i++) {                                             \
            switch (op) {                                                            \
            case 0: case 4: a[i] = (T)(a[i] + b[i]); break;                          \
            case 1: a[i] = (T)(a[i] * b[i]); break;                                  \
            case 2: a[i] = a[i] > b[i] ? a[i] : b[i]; break;                         \
            default: a[i] = a[i] < b[i] ? a[i] : b[i]; break;                        \
            }                                                                        \
        }                                                                            \
    } while (0)
#define AVERAGE(T)                                                                   \
    do {                                                                             \
        T *a = (T *)acc;                                                             \
        for (size_t i = 0; i < n; i++) a[i] = (T)(a[i] / (T)nranks);                 \
    } while (0)

static int reduce(void *acc, const void *in, size_t n, int dt, int op) {
    switch (dt) {
    case 0: REDUCE(int8_t); break;
    case 1: REDUCE(uint8_t); break;
    case 2: REDUCE(int32_t); break;
    case 3: REDUCE(uint32_t); break;
    case 4: REDUCE(int64_t); break;
    case 5: REDUCE(uint64_t); break;
    case 7: REDUCE(float); break;
    case 8: REDUCE(double); break;
    default: return -1;
    }
    return 0;
}

static void average(void *acc, size_t n, int dt, int nranks) {
    switch (dt) {
    case 0: AVERAGE(int8_t); break;
    case 1: AVERAGE(uint8_t); break;
    case 2: AVERAGE(int32_t); break;
    case 3: AVERAGE(uint32_t); break;
    case 4: AVERAGE(int64_t); break;
    case 5: AVERAGE(uint64_t); break;
    case 7: AVERAGE(float); break;
    case 8: AVERAGE(double); break;
    }
}

static size_t op_bytes(const struct op *o) {
    size_t b = o->count * dt_size(o->dt);
    return o->kind == OP_ALLGATHER ? b * (size_t)o->comm->nranks : b;
}

static ncclResult_t exec_one(struct op *o) {
    struct ncclComm *c = o->comm;
    size_t n = o->count, bytes = n * dt_size(o->dt);
    long at;
    if (fault("PREFLIGHT_STANDIN_HANG", &at) == c->rank && (long)op_bytes(o) > at) {
        hang_until_abort(c);
        return ncclInternalError;
    }
    if (fault("PREFLIGHT_STANDIN_ASYNC_ERROR", &at) == c->rank && (long)op_bytes(o) >= at) {
        ncclResult_t r = fail(ncclRemoteError, "NET/Socket : socketProgress: Connection closed by remote peer rank %d (127.0.0.1)",
                              (c->rank + 1) % c->nranks);
        cut(c);
        return r;
    }
    unsigned char *send = NULL, *recv = NULL;
    if (o->kind != OP_RECV) send = host_of(o->send, o->kind == OP_BROADCAST && c->rank != o->peer ? 0 : bytes, NULL);
    if (o->kind != OP_SEND) recv = host_of(o->recv, o->kind == OP_ALLGATHER ? bytes * (size_t)c->nranks : bytes, NULL);
    if ((o->kind != OP_RECV && !send && !(o->kind == OP_BROADCAST && c->rank != o->peer)) ||
        (o->kind != OP_SEND && !recv))
        return fail(ncclUnhandledCudaError, "Cuda failure 'an illegal memory access was encountered': a buffer was freed before the operation ran");
    ncclResult_t r = ncclSuccess;
    struct msg *m = NULL;
    switch (o->kind) {
    case OP_ALLREDUCE: {
        unsigned char *mine = malloc(bytes ? bytes : 1), *acc = malloc(bytes ? bytes : 1);
        if (!mine || !acc) { free(mine); free(acc); return ncclSystemError; }
        memcpy(mine, send, bytes);
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++)
            if (p != c->rank && send_msg(c, p, CH_COLL, o->seq, mine, bytes)) r = fail(ncclRemoteError, "NET/Socket : send to rank %d failed", p);
        /* Every rank adds in rank order: the same result everywhere. */
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++) {
            const unsigned char *in = mine;
            if (p != c->rank && (r = take(c, p, CH_COLL, o->seq, &m)) != ncclSuccess) break;
            if (p != c->rank) {
                if (m->len != bytes) r = fail(ncclInvalidUsage, "AllReduce : rank %d sent %zu bytes, this rank expected %zu", p, m->len, bytes);
                in = m->data;
            }
            if (r == ncclSuccess) {
                if (p == 0) memcpy(acc, in, bytes);
                else if (reduce(acc, in, n, o->dt, o->redop)) r = fail(ncclInvalidArgument, "AllReduce : the stand-in does not reduce type %d", o->dt);
            }
            free(m);
            m = NULL;
        }
        if (r == ncclSuccess && o->redop == ncclAvg) average(acc, n, o->dt, c->nranks);
        if (r == ncclSuccess) memcpy(recv, acc, bytes);
        free(mine);
        free(acc);
        break;
    }
    case OP_BROADCAST:
        if (c->rank == o->peer) {
            if (recv != send) memmove(recv, send, bytes);
            for (int p = 0; p < c->nranks && r == ncclSuccess; p++)
                if (p != c->rank && send_msg(c, p, CH_COLL, o->seq, recv, bytes)) r = fail(ncclRemoteError, "NET/Socket : send to rank %d failed", p);
        } else if ((r = take(c, o->peer, CH_COLL, o->seq, &m)) == ncclSuccess) {
            if (m->len != bytes) r = fail(ncclInvalidUsage, "Broadcast : root sent %zu bytes, this rank expected %zu", m->len, bytes);
            else memcpy(recv, m->data, bytes);
            free(m);
        }
        break;
    case OP_ALLGATHER: {
        unsigned char *mine = malloc(bytes ? bytes : 1);
        if (!mine) return ncclSystemError;
        memcpy(mine, send, bytes);
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++)
            if (p != c->rank && send_msg(c, p, CH_COLL, o->seq, mine, bytes)) r = fail(ncclRemoteError, "NET/Socket : send to rank %d failed", p);
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++) {
            if (p == c->rank) { memcpy(recv + bytes * (size_t)p, mine, bytes); continue; }
            if ((r = take(c, p, CH_COLL, o->seq, &m)) != ncclSuccess) break;
            if (m->len != bytes) r = fail(ncclInvalidUsage, "AllGather : rank %d sent %zu bytes, this rank expected %zu", p, m->len, bytes);
            else memcpy(recv + bytes * (size_t)p, m->data, bytes);
            free(m);
        }
        free(mine);
        break;
    }
    case OP_SEND:
        if ((r = take(c, o->peer, CH_CTS, o->seq, &m)) != ncclSuccess) break;
        free(m);
        if (send_msg(c, o->peer, CH_P2P, o->seq, send, bytes)) r = fail(ncclRemoteError, "NET/Socket : send to rank %d failed", o->peer);
        break;
    case OP_RECV:
        if (!o->cts_sent && send_msg(c, o->peer, CH_CTS, o->seq, "", 0)) {
            r = fail(ncclRemoteError, "NET/Socket : send to rank %d failed", o->peer);
            break;
        }
        if ((r = take(c, o->peer, CH_P2P, o->seq, &m)) == ncclSuccess) {
            if (m->len != bytes) r = fail(ncclInvalidUsage, "Recv : rank %d sent %zu bytes, this rank posted %zu", o->peer, m->len, bytes);
            else memcpy(recv, m->data, bytes);
            free(m);
        }
        break;
    }
    if (r == ncclSuccess && o->kind != OP_SEND && fault("PREFLIGHT_STANDIN_CORRUPT", &at) == c->rank &&
        (long)op_bytes(o) >= at && bytes >= 4)
        recv[3] ^= 0x40; /* a float's exponent, an integer's high byte: never within a tolerance */
    return r;
}

static void release(struct ncclComm *c) {
    pthread_mutex_lock(&c->mu);
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void run_one(struct op *o) {
    struct ncclComm *c = o->comm;
    /* ncclInProgress: the communicator is still connecting the operation
     * queued last (see submit); this one is on the stream, so it runs. */
    if (!c->aborted && (c->async == ncclSuccess || c->async == ncclInProgress)) {
        ncclResult_t r = exec_one(o);
        if (r != ncclSuccess && !c->aborted) set_error(c, r);
    }
    release(c);
}

static void run_op(struct op *op) {
    if (op->kind == OP_CALL) {
        op->call(op->arg);
    } else if (op->kind == OP_GROUP) {
        /* A group posts all its recvs before any of its sends waits: what
         * makes a grouped exchange with a peer (or with itself) complete. */
        for (struct op *o = op->group; o; o = o->next) {
            struct ncclComm *c = o->comm;
            if (o->kind != OP_RECV || c->aborted) continue;
            if (send_msg(c, o->peer, CH_CTS, o->seq, "", 0) && !c->aborted)
                set_error(c, fail(ncclRemoteError, "NET/Socket : send to rank %d failed", o->peer));
            o->cts_sent = 1;
        }
        for (struct op *o = op->group, *next; o; o = next) {
            next = o->next;
            run_one(o);
            free(o);
        }
    } else {
        run_one(op);
    }
    free(op);
}

static void enqueue(struct CUstream_st *s, struct op *op) {
    pthread_mutex_lock(&s->mu);
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A non-blocking communicator's first operation connects to its peers
 * before it is queued, as NCCL's lazy connection setup does: the call
 * returns ncclInProgress, ncclCommGetAsyncError says ncclInProgress until
 * the operation is on its stream (an empty stream meanwhile looks done),
 * and any other call on the communicator before then is refused. */
struct later { struct CUstream_st *stream; struct op *op; struct ncclComm *comm; };

static void *connect_main(void *p) {
    struct later l = *(struct later *)p;
    free(p);
    usleep(20000);
    enqueue(l.stream, l.op);
    pthread_mutex_lock(&l.comm->mu);
    if (l.comm->async == ncclInProgress) l.comm->async = ncclSuccess;
    pthread_cond_broadcast(&l.comm->cv);
    pthread_mutex_unlock(&l.comm->mu);
    return NULL;
}

static ncclResult_t submit(struct ncclComm *c, struct CUstream_st *s, struct op *op) {
    struct later *l = c->blocking || c->connected ? NULL : malloc(sizeof *l);
    pthread_t t;
    if (l) {
        c->connected = 1;
        *l = (struct later){s, op, c};
        pthread_mutex_lock(&c->mu);
        c->async = ncclInProgress;
        pthread_mutex_unlock(&c->mu);
        if (pthread_create(&t, NULL, connect_main, l) == 0) {
            pthread_detach(t);
            INFO("Connected all rings, use ring PXN 0 GDR 0");
            return ncclInProgress;
        }
        free(l);
        c->async = ncclSuccess;
    }
    enqueue(s, op);
    return ncclSuccess;
}

/* ncclGroupStart/End: operations issued in between are kept per thread and
 * queued together at the outermost End, on the first one's stream. */
static __thread int group_depth;
static __thread struct op *group_head, *group_tail;
static __thread struct CUstream_st *group_stream;

static const char *op_name(int kind) {
    static const char *names[] = {"AllReduce", "Broadcast", "AllGather", "Send", "Recv"};
    return names[kind];
}

static ncclResult_t issue(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt, int redop,
                          int peer, ncclComm_t c, cudaStream_t stream) {
    const char *name = op_name(kind);
    alive(c, name);
    if (!c) return fail(ncclInvalidArgument, "%s : comm argument is NULL", name);
    if (c->async == ncclInProgress) return fail(ncclInvalidUsage, "%s : the communicator is still being initialised", name);
    if (c->aborted) return fail(ncclInvalidUsage, "%s : the communicator was aborted", name);
    if (dt_size(dt) == 0) return fail(ncclInvalidArgument, "%s : invalid type %d", name, (int)dt);
    if ((kind == OP_ALLREDUCE) && (redop < 0 || redop > 4)) return fail(ncclInvalidArgument, "%s : invalid reduction operation %d", name, redop);
    if ((kind == OP_BROADCAST) && (peer < 0 || peer >= c->nranks))
        return fail(ncclInvalidArgument, "%s : invalid root %d (root should be in the 0..%d range)", name, peer, c->nranks);
    if ((kind == OP_SEND || kind == OP_RECV) && (peer < 0 || peer >= c->nranks))
        return fail(ncclInvalidArgument, "%s : invalid peer %d (peer should be in the 0..%d range)", name, peer, c->nranks);
    size_t bytes = count * dt_size(dt);
    size_t in_bytes = (kind == OP_BROADCAST && c->rank != peer) || kind == OP_RECV ? 0 : bytes;
    size_t out_bytes = kind == OP_SEND ? 0 : kind == OP_ALLGATHER ? bytes * (size_t)c->nranks : bytes;
    int dev;
    if (in_bytes) {
        if (!host_of(send, in_bytes, &dev)) return fail(ncclInvalidArgument, "%s : sendbuff %p is not a valid pointer", name, send);
        if (dev != c->dev) return fail(ncclInvalidArgument, "%s : sendbuff allocated on device %d mismatchs with NCCL device %d", name, dev, c->dev);
    }
    if (out_bytes) {
        if (!host_of(recv, out_bytes, &dev)) return fail(ncclInvalidArgument, "%s : recvbuff %p is not a valid pointer", name, recv);
        if (dev != c->dev) return fail(ncclInvalidArgument, "%s : recvbuff allocated on device %d mismatchs with NCCL device %d", name, dev, c->dev);
    }
    if (!stream || !known_stream(stream)) return fail(ncclUnhandledCudaError, "Cuda failure 'invalid resource handle'");
    struct op *o = calloc(1, sizeof *o);
    if (!o) return ncclSystemError;
    *o = (struct op){NULL, kind, c, send, recv, count, (int)dt, redop, peer, 0, NULL, 0, NULL, NULL};
    pthread_mutex_lock(&c->mu);
    if (kind == OP_SEND) o->seq = c->send_seq[peer]++;
    else if (kind == OP_RECV) o->seq = c->recv_seq[peer]++;
    else o->seq = c->coll_seq++;
    c->pending++;
    pthread_mutex_unlock(&c->mu);
    if (group_depth > 0) {
        if (group_tail) group_tail->next = o;
        else { group_head = o; group_stream = stream; }
        group_tail = o;
        return ncclSuccess;
    }
    return submit(c, stream, o);
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return issue(OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, (int)op, 0, comm, stream);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
    return issue(OP_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root, comm, stream);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
    return issue(OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return issue(OP_SEND, sendbuff, NULL, count, datatype, 0, peer, comm, stream);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return issue(OP_RECV, NULL, recvbuff, count, datatype, 0, peer, comm, stream);
}

EXPORT ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call");
    if (--group_depth > 0 || !group_head) return ncclSuccess;
    struct op *g = calloc(1, sizeof *g);
    if (!g) return ncclSystemError;
    g->kind = OP_GROUP;
    /* Sends first: a rank's recv from a peer then never waits for a send
     * this rank has yet to make. */
    struct op *sends = NULL, **st = &sends, *rest = NULL, **rt = &rest;
    for (struct op *o = group_head, *next; o; o = next) {
        next = o->next;
        o->next = NULL;
        if (o->kind == OP_SEND) { *st = o; st = &o->next; }
        else { *rt = o; rt = &o->next; }
    }
    *st = rest;
    g->group = sends;
    struct CUstream_st *stream = group_stream;
    group_head = group_tail = NULL;
    group_stream = NULL;
    return submit(g->group->comm, stream, g);
}

/* Copies timed on the device, pinned memory, events and bus ids. */
#include "copies.c"
#include "kernels.c"
