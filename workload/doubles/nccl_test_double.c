/* TEST DOUBLE of NCCL's collectives. It is not NCCL: it exists so that the scheduler's uprobes
 * and phase detection can be exercised on machines without GPUs or a network.
 *
 * Behaviour imitated: a collective among `nranks` ranks, here threads of one process. Each rank
 * waits for the others at a barrier (mutex + condition variable: futex waits between threads),
 * rank 0 reduces every rank's buffer on the CPU, a simulated transfer takes count * 4 bytes at
 * 1 GB/s (at least 200 µs), and a second barrier releases everyone.
 *
 * Convention: ncclCommInitRank(comm, nranks, id, rank) ignores `id` (one communicator per
 * process); datatype and op are taken as float32 sum.
 *
 * Ranks in separate processes: an `id` of "file:<path>" makes the communicator span processes,
 * as a real ncclUniqueId does. The ranks then meet at a barrier in a file they all map shared
 * (a futex on a generation counter), and a collective is that barrier followed by the simulated
 * transfer; nothing is reduced across processes. The slowest rank sets everyone's pace, and a
 * rank that never arrives (stuck, or killed) leaves the others waiting inside the call, as
 * NCCL's do. */
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
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

/* The barrier shared by ranks in separate processes. */
struct shared_barrier {
	_Atomic uint32_t arrived;
	_Atomic uint32_t generation;
};

static struct shared_barrier *shared;
static uint32_t shared_ranks;

static int map_shared(const char *path, int ranks)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, sizeof(struct shared_barrier)) != 0) {
		close(fd);
		return -1;
	}
	void *p = mmap(0, sizeof(struct shared_barrier), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -1;
	shared = p;
	shared_ranks = (uint32_t)ranks;
	return 0;
}

static void shared_barrier(void)
{
	uint32_t mine = atomic_load(&shared->generation);
	if (atomic_fetch_add(&shared->arrived, 1) + 1 == shared_ranks) {
		atomic_store(&shared->arrived, 0);
		atomic_fetch_add(&shared->generation, 1);
		syscall(SYS_futex, &shared->generation, FUTEX_WAKE, INT_MAX, 0, 0, 0);
		return;
	}
	while (atomic_load(&shared->generation) == mine)
		syscall(SYS_futex, &shared->generation, FUTEX_WAIT, mine, 0, 0, 0);
}

static void transfer(size_t count)
{
	uint64_t us = count * 4 / 1000;
	if (us < 200)
		us = 200;
	struct timespec t = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
	nanosleep(&t, 0);
}

int ncclCommInitRank(void **comm, int ranks, char id[128], int rank)
{
	if (ranks < 1 || ranks > MAX_RANKS || rank < 0 || rank >= ranks)
		return 4; /* ncclInvalidArgument */
	if (id && strncmp(id, "file:", 5) == 0) {
		char path[128];
		memcpy(path, id + 5, sizeof(path) - 5);
		path[sizeof(path) - 6] = 0;
		if (map_shared(path, ranks) != 0)
			return 2; /* ncclSystemError */
	}
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
	if (shared) {
		(void)send; (void)recv;
		shared_barrier();
		transfer(count);
		pthread_mutex_lock(&lock);
		collectives++;
		pthread_mutex_unlock(&lock);
		return 0;
	}
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
		pthread_mutex_unlock(&lock);
		transfer(count);
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
