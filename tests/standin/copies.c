/*
 * The stand-in's copies (included by standin.c, one translation unit):
 * pinned host memory, asynchronous copies and fills on a stream, events,
 * host functions and the devices' PCI addresses, as
 * crates/nccl-sys/src/copies.rs uses them (prototypes from the CUDA 12.4
 * driver API documentation).
 *
 * A copy's time is modelled, not measured: this machine's memcpy says
 * nothing of a GPU's link. Each device has one copy engine per direction
 * (and one for device-to-device copies and fills); a copy starts when it
 * is issued, its stream's previous work has ended and its engine is free,
 * and lasts its bytes over the rate (PREFLIGHT_STANDIN_HOST_GBPS or
 * _D2D_GBPS, times the device's PREFLIGHT_STANDIN_SLOW_GPU fraction).
 * Devices behind one uplink (PREFLIGHT_STANDIN_UPLINK=N:G, every N
 * consecutive devices; N:G:K, only the K-th such group) share its G GB/s
 * per direction evenly among those with copies queued, as GPUs behind
 * one PCIe switch do when they copy at once. The bytes really move
 * (so a pattern written is read back), the stream's thread then sleeps
 * until the modelled end, and an event records the modelled time its
 * stream reached it: what cuEventElapsedTime reports.
 */
#include <time.h>

enum { DIR_H2D = 0, DIR_D2H = 1, DIR_D2D = 2 };

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void sleep_until(double ns) {
    long long whole = ns > 0 ? (long long)ns : 0;
    struct timespec t = {(time_t)(whole / 1000000000LL), (long)(whole % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
    }
}

static double env_double(const char *var, double fallback) {
    const char *v = getenv(var);
    if (!v || !*v) return fallback;
    double d = strtod(v, NULL);
    return d > 0 ? d : fallback;
}

/* The fraction of its rate device `dev` copies at: D:F[,D:F...]. */
static double slow_fraction(int dev) {
    const char *v = getenv("PREFLIGHT_STANDIN_SLOW_GPU");
    while (v && *v) {
        char *end;
        long d = strtol(v, &end, 10);
        if (*end != ':') break;
        double f = strtod(end + 1, &end);
        if (d == dev && f > 0) return f;
        v = *end == ',' ? end + 1 : NULL;
    }
    return 1.0;
}

static int hung_device(int dev) {
    const char *v = getenv("PREFLIGHT_STANDIN_COPY_HANG");
    return v && *v && atoi(v) == dev;
}

static pthread_mutex_t g_model = PTHREAD_MUTEX_INITIALIZER;
static double g_engine[MAX_DEVICES][3]; /* when each engine is free (ns) */
static int g_pending[MAX_DEVICES][2];   /* host copies queued, per direction */

/* The uplink device `dev` shares (PREFLIGHT_STANDIN_UPLINK=N:G[:K]): its
 * rate G, and N in `*n`; 0 where it shares none. */
static double uplink_of(int dev, long *n) {
    const char *v = getenv("PREFLIGHT_STANDIN_UPLINK");
    if (!v || !*v) return 0;
    char *rest;
    *n = strtol(v, &rest, 10);
    double g = *rest == ':' ? strtod(rest + 1, &rest) : 0;
    long only = *rest == ':' ? strtol(rest + 1, NULL, 10) : -1;
    if (*n <= 0 || g <= 0 || (only >= 0 && dev / *n != only)) return 0;
    return g;
}

struct copy_work {
    struct CUstream_st *stream;
    int dev, dir;
    unsigned char *to;
    const unsigned char *from; /* NULL: a fill of `word` */
    size_t len;
    unsigned int word;
    CUdeviceptr written; /* the device address written, 0 for none */
    double issued;
};

/* A stuck bit: PREFLIGHT_STANDIN_BAD_BYTE=D:OFFSET. */
static void stick(int dev, CUdeviceptr at, size_t len) {
    long offset = 0;
    int bad = fault("PREFLIGHT_STANDIN_BAD_BYTE", &offset);
    if (bad != dev || offset < 0 || !at) return;
    CUdeviceptr addr = device_base(dev) + (CUdeviceptr)offset;
    if (addr < at || addr - at >= len) return;
    unsigned char *h = host_of((const void *)(uintptr_t)addr, 1, NULL);
    if (h) *h |= 0x10;
}

static void run_copy(void *p) {
    struct copy_work *w = p;
    if (hung_device(w->dev))
        for (;;) pause();
    double gbps = w->dir == DIR_D2D ? env_double("PREFLIGHT_STANDIN_D2D_GBPS", 1000)
                                    : env_double("PREFLIGHT_STANDIN_HOST_GBPS", 24);
    gbps *= slow_fraction(w->dev);
    pthread_mutex_lock(&g_model);
    double start = w->issued;
    if (w->stream->vclock > start) start = w->stream->vclock;
    if (g_engine[w->dev][w->dir] > start) start = g_engine[w->dev][w->dir];
    double rate = gbps;
    long n = 0;
    double shared = uplink_of(w->dev, &n);
    if (shared > 0 && w->dir != DIR_D2D) {
        /* Shared fairly among the group's devices copying this way: those
         * with copies queued, or whose last copy ends after this one
         * starts in modelled time (the stand-in's threads may run them
         * one after another on a busy machine; a GPU's engines do not). */
        int busy = 0;
        for (long d = w->dev / n * n; d < (w->dev / n + 1) * n && d < MAX_DEVICES; d++)
            busy += d == w->dev || g_pending[d][w->dir] > 0 || g_engine[d][w->dir] > start;
        if (busy < 1) busy = 1;
        if (shared / busy < rate) rate = shared / busy;
    }
    double end = start + (double)w->len / rate; /* GB/s is bytes per ns */
    g_engine[w->dev][w->dir] = end;
    w->stream->vclock = end;
    pthread_mutex_unlock(&g_model);
    if (w->from) {
        memmove(w->to, w->from, w->len);
    } else {
        for (size_t i = 0; i + 4 <= w->len; i += 4) memcpy(w->to + i, &w->word, 4);
    }
    stick(w->dev, w->written, w->len);
    sleep_until(end);
    if (w->dir != DIR_D2D) {
        pthread_mutex_lock(&g_model);
        g_pending[w->dev][w->dir]--;
        pthread_mutex_unlock(&g_model);
    }
    free(w);
}

struct CUevent_st {
    int recorded, done;
    double ts;
};
typedef struct CUevent_st *CUevent;

struct event_work {
    struct CUstream_st *stream;
    CUevent event;
    double issued;
};

static void run_event(void *p) {
    struct event_work *w = p;
    pthread_mutex_lock(&g_model);
    double ts = w->issued > w->stream->vclock ? w->issued : w->stream->vclock;
    w->stream->vclock = ts;
    w->event->ts = ts;
    w->event->done = 1;
    pthread_mutex_unlock(&g_model);
    free(w);
}

static CUresult queue_call(struct CUstream_st *s, void (*call)(void *), void *arg) {
    struct op *op = calloc(1, sizeof *op);
    if (!op) {
        free(arg);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->kind = OP_CALL;
    op->call = call;
    op->arg = arg;
    enqueue(s, op);
    return CUDA_SUCCESS;
}

/* A stream of the current context, or why not. */
static CUresult usable_stream(CUstream s) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    /* The legacy stream (NULL) is not modelled: every caller names one. */
    if (!s || !known_stream(s) || s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (s->ctx != g_current) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

/* Device memory of the stream's device behind [ptr, ptr + len), or NULL. */
static unsigned char *device_bytes(CUstream s, CUdeviceptr ptr, size_t len) {
    int dev = -1;
    unsigned char *h = host_of((const void *)(uintptr_t)ptr, len, &dev);
    return h && dev == s->ctx->dev ? h : NULL;
}

/* When queued work may start in modelled time: at once on an idle
 * stream; behind queued work, when that work ends (0: the stream's clock
 * says), however long the host took to queue it, as on a GPU. */
static double issued_at(CUstream s) {
    pthread_mutex_lock(&s->mu);
    int idle = !s->head && !s->running;
    pthread_mutex_unlock(&s->mu);
    return idle ? now_ns() : 0;
}

/* A host slow to queue (PREFLIGHT_STANDIN_QUEUE_PAUSE_US=N): the calling
 * thread pauses N µs before each asynchronous copy or event record, as a
 * loaded node's host thread may between two calls. */
static void host_pause(void) {
    double us = env_double("PREFLIGHT_STANDIN_QUEUE_PAUSE_US", 0);
    if (us > 0) sleep_until(now_ns() + us * 1e3);
}

static CUresult queue_copy(CUstream s, int dir, unsigned char *to, const unsigned char *from, size_t len,
                           unsigned int word, CUdeviceptr written) {
    host_pause();
    struct copy_work *w = calloc(1, sizeof *w);
    if (!w) return CUDA_ERROR_OUT_OF_MEMORY;
    *w = (struct copy_work){s, s->ctx->dev, dir, to, from, len, word, written, issued_at(s)};
    if (dir != DIR_D2D) {
        pthread_mutex_lock(&g_model);
        g_pending[w->dev][dir]++;
        pthread_mutex_unlock(&g_model);
    }
    return queue_call(s, run_copy, w);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    unsigned char *to = device_bytes(s, dst, bytes);
    if (!to || (!src && bytes) || host_of(src, 1, NULL)) return CUDA_ERROR_INVALID_VALUE;
    return queue_copy(s, DIR_H2D, to, src, bytes, 0, dst);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    const unsigned char *from = device_bytes(s, src, bytes);
    if (!from || (!dst && bytes) || host_of(dst, 1, NULL)) return CUDA_ERROR_INVALID_VALUE;
    return queue_copy(s, DIR_D2H, dst, from, bytes, 0, 0);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    unsigned char *to = device_bytes(s, dst, bytes);
    const unsigned char *from = device_bytes(s, src, bytes);
    if (!to || !from) return CUDA_ERROR_INVALID_VALUE;
    return queue_copy(s, DIR_D2D, to, from, bytes, 0, dst);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t words, CUstream s) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    if (dst % 4 || words > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *to = device_bytes(s, dst, words * 4);
    if (!to) return CUDA_ERROR_INVALID_VALUE;
    return queue_copy(s, DIR_D2D, to, NULL, words * 4, value, dst);
}

/* Pinned host memory: page-aligned host memory, remembered so that
 * cuMemFreeHost refuses what it did not hand out. */
static void *g_pinned[4096];

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
    if (!pp || bytes == 0 || flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < sizeof g_pinned / sizeof g_pinned[0] && g_pinned[i]) i++;
    int ok = i < sizeof g_pinned / sizeof g_pinned[0];
    if (ok) g_pinned[i] = p;
    pthread_mutex_unlock(&g_lock);
    if (!ok) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < sizeof g_pinned / sizeof g_pinned[0] && !found; i++)
        if (p && g_pinned[i] == p) {
            g_pinned[i] = NULL;
            found = 1;
        }
    pthread_mutex_unlock(&g_lock);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
    if (!pe || flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    CUevent e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *pe = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    host_pause();
    struct event_work *w = calloc(1, sizeof *w);
    if (!w) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_model);
    e->recorded = 1;
    e->done = 0;
    pthread_mutex_unlock(&g_model);
    *w = (struct event_work){s, e, issued_at(s)};
    return queue_call(s, run_event, w);
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_model);
    CUresult r = !start->recorded || !end->recorded ? CUDA_ERROR_INVALID_HANDLE
                 : !start->done || !end->done      ? CUDA_ERROR_NOT_READY
                                                   : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) *ms = (float)((end->ts - start->ts) / 1e6);
    pthread_mutex_unlock(&g_model);
    return r;
}

/* cuLaunchHostFunc: the stream calls fn(data) on its own thread when it
 * reaches it and waits for it, as the driver's host functions; the
 * stream's clock then reads the moment it returned. */
typedef void (*CUhostFn)(void *);

struct host_fn_work {
    struct CUstream_st *stream;
    CUhostFn fn;
    void *data;
};

static void run_host_fn(void *p) {
    struct host_fn_work *w = p;
    w->fn(w->data);
    double now = now_ns();
    pthread_mutex_lock(&g_model);
    if (w->stream->vclock < now) w->stream->vclock = now;
    pthread_mutex_unlock(&g_model);
    free(w);
}

EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    struct host_fn_work *w = calloc(1, sizeof *w);
    if (!w) return CUDA_ERROR_OUT_OF_MEMORY;
    *w = (struct host_fn_work){s, fn, data};
    return queue_call(s, run_host_fn, w);
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    /* As the driver: an event its stream has yet to reach is freed once
     * reached; the stand-in keeps such an event rather than track that. */
    pthread_mutex_lock(&g_model);
    int pending = e->recorded && !e->done;
    pthread_mutex_unlock(&g_model);
    if (!pending) free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
    if (!out || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    char id[64];
    snprintf(id, sizeof id, "0000:%02X:00.0", dev + 1);
    const char *list = getenv("PREFLIGHT_STANDIN_BUS_IDS");
    for (int i = 0; list && *list; i++) {
        const char *comma = strchr(list, ',');
        size_t n = comma ? (size_t)(comma - list) : strlen(list);
        if (i == dev && n > 0 && n < sizeof id) {
            memcpy(id, list, n);
            id[n] = 0;
            break;
        }
        list = comma ? comma + 1 : NULL;
    }
    for (char *c = id; *c; c++)
        if (*c >= 'a' && *c <= 'f') *c = (char)(*c - 'a' + 'A');
    if ((int)strlen(id) >= len) return CUDA_ERROR_INVALID_VALUE;
    snprintf(out, (size_t)len, "%s", id);
    return CUDA_SUCCESS;
}
