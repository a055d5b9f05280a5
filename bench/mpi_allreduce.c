/* 64 MiB MPI_Allreduce (float sum): 2 warm-up calls, then the mean of 5
 * timed calls, each after a barrier; rank 0 prints seconds per call. The
 * OpenMPI peer of bench/collective-allreduce.sh and collective-netns.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t count = (64u << 20) / 4;
    float *in = malloc(count * 4), *out = malloc(count * 4);
    for (size_t i = 0; i < count; i++) in[i] = 1.0f;
    for (int i = 0; i < 2; i++) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double total = 0;
    for (int i = 0; i < 5; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        total += MPI_Wtime() - t;
    }
    if (rank == 0) printf("%f\n", total / 5);
    MPI_Finalize();
    return 0;
}
