/* TEST DOUBLE of the CUDA driver's launch entry point, doing nothing at all: it is not CUDA.
 * It exists for `cargo xtask bench launch`, where a loop calling it measures what a probe on
 * the launch path adds to each call, with nothing of the call's own cost in the way. */
int cuInit(unsigned flags)
{
	(void)flags;
	return 0;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		   unsigned shmem, void *stream, void **params, void **extra)
{
	(void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream;
	(void)params; (void)extra;
	return 0;
}

int cuStreamSynchronize(void *stream)
{
	(void)stream;
	return 0;
}
