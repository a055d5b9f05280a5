/* The two CUDA runtime types nccl.h names, as cuda_runtime_api.h (CUDA
 * 12.4) defines them: enough to compile nccl.h against the stand-in, which
 * then checks every function the stand-in defines against NCCL's own
 * prototypes. Not the CUDA runtime: nothing else of it exists here. */
#ifndef PREFLIGHT_STANDIN_CUDA_RUNTIME_H
#define PREFLIGHT_STANDIN_CUDA_RUNTIME_H
#define CUDART_VERSION 12040
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif
