/* TEST DOUBLE of NCCL's collectives. It is not NCCL: it exists so that the scheduler's uprobes
 * and phase detection can be exercised on machines without GPUs or a network.
 *
 * Behaviour imitated: a collective among `nranks` ranks, here threads of one process. Each rank
 * waits for the others at a barrier (mutex + condition variable: futex waits between threads),
 * rank 0 reduces every rank's buffer on the CPU, a simulated transfer takes count * 4 bytes at
 * 1 GB/s (at least 200 µs), and a second barrier releases everyone.
 *
 * Convention: ncclCommInitRank(comm, nranks, id, rank) ignores `id` (one communicator per
 * process); datatype and op are taken as float32 sum. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 8

struct comm { int rank; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int nranks = 1;
static int arrived;
static uint64_t generation;
static struct comm comms[MAX_RANKS];
static float *sendbufs[MAX_RANKS];
static float *recvbufs[MAX_RANKS];
static uint64_t collectives;

int ncclCommInitRank(void **comm, int ranks, char id[128], int rank)
{
	(void)id;
	if (ranks < 1 || ranks > MAX_RANKS || rank < 0 || rank >= ranks)
		return 4; /* ncclInvalidArgument */
	pthread_mutex_lock(&lock);
	nranks = ranks;
	comms[rank].rank = rank;
	*comm = &comms[rank];
	pthread_mutex_unlock(&lock);
	return 0;
}

static void barrier(void)
{
	uint64_t mine = generation;
	if (++arrived == nranks) {
		arrived = 0;
		generation++;
		pthread_cond_broadcast(&changed);
	} else {
		while (generation == mine)
			pthread_cond_wait(&changed, &lock);
	}
}

static int collective(const void *send, void *recv, size_t count, void *comm)
{
	int rank = comm ? ((struct comm *)comm)->rank : 0;
	pthread_mutex_lock(&lock);
	sendbufs[rank] = (float *)send;
	recvbufs[rank] = (float *)recv;
	barrier();
	if (rank == 0) {
		for (size_t i = 0; i < count; i++) {
			float sum = 0;
			for (int r = 0; r < nranks; r++)
				sum += sendbufs[r] ? sendbufs[r][i] : 0;
			for (int r = 0; r < nranks; r++)
				if (recvbufs[r])
					recvbufs[r][i] = sum;
		}
		uint64_t us = count * 4 / 1000;
		if (us < 200)
			us = 200;
		pthread_mutex_unlock(&lock);
		struct timespec t = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
		nanosleep(&t, 0);
		pthread_mutex_lock(&lock);
		collectives++;
	}
	barrier();
	pthread_mutex_unlock(&lock);
	return 0;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op, void *comm, void *stream)
{
	(void)datatype; (void)op; (void)stream;
	return collective(send, recv, count, comm);
}

int ncclAllGather(const void *send, void *recv, size_t count, int datatype, void *comm, void *stream)
{
	(void)datatype; (void)stream;
	return collective(send, recv, count, comm);
}

int ncclReduceScatter(const void *send, void *recv, size_t count, int datatype, int op, void *comm, void *stream)
{
	(void)datatype; (void)op; (void)stream;
	return collective(send, recv, count, comm);
}

int ncclBroadcast(const void *send, void *recv, size_t count, int datatype, int root, void *comm, void *stream)
{
	(void)datatype; (void)root; (void)stream;
	return collective(send, recv, count, comm);
}

int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }

/* For tests: collectives completed. */
uint64_t ringside_nccl_double_collectives(void)
{
	pthread_mutex_lock(&lock);
	uint64_t n = collectives;
	pthread_mutex_unlock(&lock);
	return n;
}
