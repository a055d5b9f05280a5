/*
 * The stand-in's kernels (included by standin.c after copies.c, one
 * translation unit): modules and launches of the CUDA driver API as
 * crates/nccl-sys/src/patterns.rs uses them (prototypes from the CUDA
 * 12.4 driver API documentation).
 *
 * A module is the PTX text it was loaded from (text without `.version`
 * and `.target` is refused, CUDA_ERROR_INVALID_IMAGE); a function is
 * found by the name its `.entry` declares in that text, as the driver
 * finds it (CUDA_ERROR_NOT_FOUND otherwise), and must be one of the
 * memory test's three, the only kernels the stand-in can run; a launch
 * reads the parameters in the order and of the types patterns.ptx
 * declares, and runs the kernel of that name on the CPU on the stream's
 * thread, computing each word as the PTX does. Faults as for copies: a
 * stuck bit (PREFLIGHT_STANDIN_BAD_BYTE) holds after every kernel's
 * write, as a bad cell would; on a hung device
 * (PREFLIGHT_STANDIN_COPY_HANG) no kernel ends. A kernel's time is
 * modelled from the bytes it reads and writes at
 * PREFLIGHT_STANDIN_MEM_GBPS (default 3000: an H200's memory), and is
 * never less than what the CPU took.
 */

typedef struct CUmod_st {
    char *text;
} *CUmodule;

enum { K_FILL = 0, K_VERIFY = 1, K_VERIFY_INVERT = 2 };
static const char *const KERNEL_NAMES[] = {"preflight_fill", "preflight_verify",
                                           "preflight_verify_invert"};

typedef struct CUfunc_st {
    int which;
} *CUfunction;

static struct CUfunc_st g_kernels[3] = {{K_FILL}, {K_VERIFY}, {K_VERIFY_INVERT}};

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    if (!g_current) return CUDA_ERROR_INVALID_CONTEXT;
    const char *text = image;
    if (!strstr(text, ".version") || !strstr(text, ".target")) return CUDA_ERROR_INVALID_IMAGE;
    struct CUmod_st *mod = calloc(1, sizeof *mod);
    if (!mod || !(mod->text = strdup(text))) {
        free(mod);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *m = mod;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    free(m->text);
    free(m);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    char decl[128];
    snprintf(decl, sizeof decl, ".entry %s(", name);
    if (!strstr(m->text, decl)) return CUDA_ERROR_NOT_FOUND;
    for (int k = 0; k < 3; k++) {
        if (strcmp(name, KERNEL_NAMES[k]) == 0) {
            *f = &g_kernels[k];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* The word patterns.ptx's preflight_word computes. */
static uint32_t pattern_word(uint32_t kind, uint64_t seed, uint64_t i, uint64_t address) {
    switch (kind) {
    case 0: return 1u << (i % 32);
    case 1: return ~(1u << (i % 32));
    case 4: return (uint32_t)address ^ (uint32_t)(address >> 32);
    default: {
        uint64_t z = seed * 0x9E3779B97F4A7C15ULL + (i + 1) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        return kind == 3 ? ~(uint32_t)z : (uint32_t)z;
    }
    }
}

struct kernel_work {
    struct CUstream_st *stream;
    int dev, which;
    CUdeviceptr buffer;
    unsigned char *memory, *found;
    uint64_t words, first, seed;
    uint32_t kind, slots;
    double issued;
};

static void run_kernel(void *p) {
    struct kernel_work *w = p;
    if (hung_device(w->dev))
        for (;;) pause();
    double began = now_ns();
    for (uint64_t i = 0; i < w->words; i++) {
        unsigned char *at = w->memory + 4 * i;
        uint32_t want = pattern_word(w->kind, w->seed, w->first + i, w->buffer + 4 * i);
        if (w->which != K_FILL) {
            uint32_t read;
            memcpy(&read, at, 4);
            if (read != want) {
                uint64_t n;
                memcpy(&n, w->found, 8);
                if (n < w->slots) {
                    unsigned char *slot = w->found + 16 + 16 * n;
                    uint64_t address = w->buffer + 4 * i;
                    memcpy(slot, &address, 8);
                    memcpy(slot + 8, &want, 4);
                    memcpy(slot + 12, &read, 4);
                }
                n++;
                memcpy(w->found, &n, 8);
            }
            if (w->which == K_VERIFY) continue;
            want = ~want;
        }
        memcpy(at, &want, 4);
    }
    if (w->which != K_VERIFY) stick(w->dev, w->buffer, 4 * w->words);
    double bytes = 4.0 * (double)w->words * (w->which == K_VERIFY_INVERT ? 2 : 1);
    double gbps = env_double("PREFLIGHT_STANDIN_MEM_GBPS", 3000) * slow_fraction(w->dev);
    pthread_mutex_lock(&g_model);
    double start = w->issued > w->stream->vclock ? w->issued : w->stream->vclock;
    double end = start + bytes / gbps;
    double took = now_ns() - began;
    if (start + took > end) end = start + took;
    w->stream->vclock = end;
    pthread_mutex_unlock(&g_model);
    sleep_until(end);
    free(w);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                               CUstream s, void **params, void **extra) {
    CUresult r = usable_stream(s);
    if (r != CUDA_SUCCESS) return r;
    if (!f || f < g_kernels || f >= g_kernels + 3) return CUDA_ERROR_INVALID_HANDLE;
    if (!params || extra || !gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || shared)
        return CUDA_ERROR_INVALID_VALUE;
    struct kernel_work *w = calloc(1, sizeof *w);
    if (!w) return CUDA_ERROR_OUT_OF_MEMORY;
    w->stream = s;
    w->dev = s->ctx->dev;
    w->which = f->which;
    memcpy(&w->buffer, params[0], 8);
    memcpy(&w->words, params[1], 8);
    memcpy(&w->first, params[2], 8);
    memcpy(&w->kind, params[3], 4);
    memcpy(&w->seed, params[4], 8);
    if (w->which != K_FILL) {
        CUdeviceptr found;
        memcpy(&found, params[5], 8);
        memcpy(&w->slots, params[6], 4);
        w->found = device_bytes(s, found, 16 + 16 * (size_t)w->slots);
    }
    w->memory = w->words > SIZE_MAX / 4 ? NULL : device_bytes(s, w->buffer, 4 * w->words);
    /* Memory outside every allocation of the stream's device: the kernel
     * would fault, which the driver reports as an illegal address. */
    if (!w->memory || (w->which != K_FILL && !w->found)) {
        free(w);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    w->issued = issued_at(s);
    return queue_call(s, run_kernel, w);
}
