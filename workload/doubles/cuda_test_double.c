/* TEST DOUBLE of the CUDA driver (and a few runtime) entry points. It is not CUDA: it exists so
 * that the scheduler's uprobes and phase detection can be exercised on machines without a GPU.
 *
 * Behaviour imitated: kernel launches are asynchronous (the call marshals its arguments and
 * returns); a "device" thread runs queued kernels one after another; the synchronize calls
 * block the caller (on a condition variable, i.e. a futex wait, as a CUDA context created with
 * blocking sync does) until the queue is drained.
 *
 * Convention: a kernel's simulated device time in microseconds is its grid's x dimension (0: none,
 * for launch-bound loops). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define QUEUE 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static pthread_cond_t drained = PTHREAD_COND_INITIALIZER;
static unsigned durations[QUEUE];
static unsigned head, tail; /* queue of durations (µs); head == tail: empty */
static int running;         /* a kernel is on the "device" */
static int started;
static uint64_t launches, syncs;

static void *device(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&lock);
	for (;;) {
		while (head == tail)
			pthread_cond_wait(&queued, &lock);
		unsigned us = durations[head % QUEUE];
		head++;
		running = 1;
		pthread_mutex_unlock(&lock);
		/* A kernel of no device time takes none (no sleep: even a 1 µs one takes ~50 µs). */
		if (us) {
			struct timespec t = { us / 1000000, (long)(us % 1000000) * 1000 };
			nanosleep(&t, 0);
		}
		pthread_mutex_lock(&lock);
		running = 0;
		if (head == tail)
			pthread_cond_broadcast(&drained);
	}
	return 0;
}

static void start_device(void)
{
	if (!started) {
		pthread_t t;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, device, 0) == 0) {
			pthread_setname_np(t, "cuda-device");
			started = 1;
		}
		pthread_attr_destroy(&attr);
	}
}

int cuInit(unsigned flags)
{
	(void)flags;
	pthread_mutex_lock(&lock);
	start_device();
	pthread_mutex_unlock(&lock);
	return 0;
}

/* A few microseconds of argument marshalling, on the caller's CPU. */
static void marshal(void **params)
{
	volatile uint64_t x = (uint64_t)(uintptr_t)params;
	for (int i = 0; i < 2000; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		   unsigned shmem, void *stream, void **params, void **extra)
{
	(void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream; (void)extra;
	marshal(params);
	pthread_mutex_lock(&lock);
	start_device();
	/* A full queue blocks the launch, as a full CUDA launch queue does. */
	while (tail - head >= QUEUE)
		pthread_cond_wait(&drained, &lock);
	durations[tail % QUEUE] = gx;
	tail++;
	launches++;
	pthread_cond_signal(&queued);
	pthread_mutex_unlock(&lock);
	return 0;
}

static int synchronize(void)
{
	pthread_mutex_lock(&lock);
	while (head != tail || running)
		pthread_cond_wait(&drained, &lock);
	syncs++;
	pthread_mutex_unlock(&lock);
	return 0;
}

int cuStreamSynchronize(void *stream) { (void)stream; return synchronize(); }
int cuCtxSynchronize(void) { return synchronize(); }
int cudaDeviceSynchronize(void) { return synchronize(); }
int cudaStreamSynchronize(void *stream) { (void)stream; return synchronize(); }

/* For tests: what the double was asked to do. */
void ringside_cuda_double_stats(uint64_t *out_launches, uint64_t *out_syncs)
{
	pthread_mutex_lock(&lock);
	*out_launches = launches;
	*out_syncs = syncs;
	pthread_mutex_unlock(&lock);
}
