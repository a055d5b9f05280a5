/* nccl.h includes it for __half, which no prototype the stand-in defines
 * uses. */
