/*
 * TEST DOUBLE of libnvidia-ml.so.1 (NVIDIA's NVML), for testing Ringside's GPU source on
 * machines without a GPU. It is not NVML: it implements only the calls the daemon makes, with
 * the C ABI of nvml.h, and answers from a control file the tests write.
 *
 * The control file is named by RINGSIDE_NVML_DOUBLE and read again at every device count (once
 * per reading), so a test can change the GPUs while the daemon runs. One setting per line:
 *
 *   gpus N                          how many GPUs (default 1; at most 64)
 *   driver VERSION                  the driver version (default 580.0-double)
 *   fail_init 1                     nvmlInit fails (driver not loaded)
 *   gpu I KEY VALUE...              a setting of GPU I:
 *     util GPU MEM                  utilisation, %
 *     memory TOTAL USED             bytes (free = total - used - 1 GiB reserved)
 *     temperature GPU HBM           °C
 *     power DRAW_MW LIMIT_MW
 *     clocks SM SM_MAX MEM MEM_MAX  MHz
 *     throttle BITS                 clock throttle reasons (nvml.h bit mask)
 *     ecc CORRECTED UNCORRECTED
 *     remapped CORR UNC PENDING FAILED
 *     process PID MEMORY SM_PCT     a compute process (repeatable, at most 16)
 *     unsupported WHAT              NVML_ERROR_NOT_SUPPORTED for WHAT: numa, temperature,
 *                                   memory_temp, power, energy, pcie, throttle, ecc, retired,
 *                                   remapped, persistence, processes, nvlink; or `all`:
 *                                   every call about the GPU
 *     lost 1                        every call about this GPU answers GPU_IS_LOST
 *     xid CODE                      a critical XID event (repeatable, at most 16): each is
 *                                   delivered once, in order, through nvmlEventSetWait
 *     slowdown C                    the slowdown temperature threshold (default 87; 0: not
 *                                   supported)
 *     busy_log PATH                 utilisation samples (nvmlDeviceGetSamples) follow an
 *                                   `ml-workload --log` file: the model is a GPU busy exactly
 *                                   while the workload is in `gpu_compute`, so each sample is
 *                                   the share of its period covered by `gpu_compute` intervals;
 *                                   only periods the log already covers are answered. Without
 *                                   it, every sample is the `util` value.
 *
 * Utilisation samples are on a 1/6 s grid (the period of NVML's own on data-centre GPUs) over
 * the last 10 s, as NVML's ring buffer keeps them.
 *
 * Lines it does not understand are ignored. Everything else has plausible defaults.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
};

#define MAX_GPUS 64
#define MAX_PROCESSES 16

struct process {
    unsigned pid;
    unsigned long long memory;
    unsigned sm;
};

struct gpu {
    unsigned index, util_gpu, util_mem, temp_gpu, temp_mem, power_mw, limit_mw;
    unsigned sm_clock, sm_max, mem_clock, mem_max;
    unsigned long long total, used, throttle, ecc_corrected, ecc_uncorrected;
    unsigned remap_corr, remap_unc, remap_pending, remap_failed;
    struct process processes[MAX_PROCESSES];
    unsigned process_count;
    char unsupported[256];
    int lost;
    unsigned long long xids[16];
    unsigned xid_count;
    unsigned slowdown;
    char busy_log[256];
};

/* XIDs of each GPU delivered so far: kept across reloads of the control file. */
static unsigned xids_delivered[MAX_GPUS];

static struct gpu gpus[MAX_GPUS];
static unsigned gpu_count = 1;
static char driver[80] = "580.0-double";
static int fail_init;
static int initialised;

static void defaults(void) {
    for (unsigned i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &gpus[i];
        memset(g, 0, sizeof *g);
        g->index = i;
        g->util_gpu = 50;
        g->util_mem = 20;
        g->total = 150754820096ULL;
        g->used = (unsigned long long)(i + 1) << 30;
        g->temp_gpu = 40;
        g->temp_mem = 42;
        g->power_mw = 300000;
        g->limit_mw = 700000;
        g->sm_clock = 1980;
        g->sm_max = 1980;
        g->mem_clock = 3201;
        g->mem_max = 3201;
        g->slowdown = 87;
    }
}

static void load(void) {
    defaults();
    gpu_count = 1;
    fail_init = 0;
    strcpy(driver, "580.0-double");
    const char *path = getenv("RINGSIDE_NVML_DOUBLE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned i;
        char key[64], rest[400];
        if (sscanf(line, "gpus %u", &gpu_count) == 1) {
            if (gpu_count > MAX_GPUS) {
                gpu_count = MAX_GPUS;
            }
        } else if (sscanf(line, "driver %79s", driver) == 1) {
        } else if (sscanf(line, "fail_init %d", &fail_init) == 1) {
        } else if (sscanf(line, "gpu %u %63s %399[^\n]", &i, key, rest) == 3 && i < MAX_GPUS) {
            struct gpu *g = &gpus[i];
            if (!strcmp(key, "util")) {
                sscanf(rest, "%u %u", &g->util_gpu, &g->util_mem);
            } else if (!strcmp(key, "memory")) {
                sscanf(rest, "%llu %llu", &g->total, &g->used);
            } else if (!strcmp(key, "temperature")) {
                sscanf(rest, "%u %u", &g->temp_gpu, &g->temp_mem);
            } else if (!strcmp(key, "power")) {
                sscanf(rest, "%u %u", &g->power_mw, &g->limit_mw);
            } else if (!strcmp(key, "clocks")) {
                sscanf(rest, "%u %u %u %u", &g->sm_clock, &g->sm_max, &g->mem_clock, &g->mem_max);
            } else if (!strcmp(key, "throttle")) {
                g->throttle = strtoull(rest, NULL, 0);
            } else if (!strcmp(key, "ecc")) {
                sscanf(rest, "%llu %llu", &g->ecc_corrected, &g->ecc_uncorrected);
            } else if (!strcmp(key, "remapped")) {
                sscanf(rest, "%u %u %u %u", &g->remap_corr, &g->remap_unc, &g->remap_pending, &g->remap_failed);
            } else if (!strcmp(key, "process") && g->process_count < MAX_PROCESSES) {
                struct process *p = &g->processes[g->process_count];
                if (sscanf(rest, "%u %llu %u", &p->pid, &p->memory, &p->sm) == 3) {
                    g->process_count++;
                }
            } else if (!strcmp(key, "unsupported")) {
                char what[32];
                size_t used = strlen(g->unsupported);
                if (sscanf(rest, "%31s", what) == 1 && used + strlen(what) + 3 < sizeof g->unsupported) {
                    snprintf(g->unsupported + used, sizeof g->unsupported - used, " %s ", what);
                }
            } else if (!strcmp(key, "xid") && g->xid_count < 16) {
                g->xids[g->xid_count++] = strtoull(rest, NULL, 10);
            } else if (!strcmp(key, "lost")) {
                g->lost = atoi(rest);
            } else if (!strcmp(key, "slowdown")) {
                g->slowdown = (unsigned)strtoul(rest, NULL, 10);
            } else if (!strcmp(key, "busy_log")) {
                sscanf(rest, "%255s", g->busy_log);
            }
        }
    }
    fclose(f);
}

/* The state of a device handle's GPU: success, lost, or the call unsupported. */
static nvmlReturn_t check(void *device, const char *what) {
    if (!initialised) {
        return NVML_ERROR_UNINITIALIZED;
    }
    struct gpu *g = device;
    if (g < gpus || g >= gpus + MAX_GPUS) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (g->lost) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    char needle[72];
    snprintf(needle, sizeof needle, " %s ", what);
    return strstr(g->unsupported, needle) || strstr(g->unsupported, " all ") ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

#define CHECK(device, what)                          \
    struct gpu *g = device;                          \
    do {                                             \
        nvmlReturn_t rc = check(device, what);       \
        if (rc != NVML_SUCCESS) {                    \
            return rc;                               \
        }                                            \
    } while (0)

static void copy(char *out, unsigned length, const char *text) {
    if (length > 0) {
        snprintf(out, length, "%s", text);
    }
}

nvmlReturn_t nvmlInit_v2(void) {
    load();
    if (fail_init) {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    return result == NVML_SUCCESS ? "Success" : "an error of the NVML test double";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    copy(version, length, driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length) {
    copy(version, length, "13.580.0-double");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    *version = 13000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialised) {
        return NVML_ERROR_UNINITIALIZED;
    }
    load();
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    if (!initialised) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (index >= gpu_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &gpus[index];
    return gpus[index].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned length) {
    CHECK(device, "name");
    copy(name, length, "NVIDIA H200 (NVML test double)");
    (void)g;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned length) {
    CHECK(device, "uuid");
    char text[80];
    snprintf(text, sizeof text, "GPU-00000000-0000-0000-0000-%012u", g->index);
    copy(uuid, length, text);
    return NVML_SUCCESS;
}

struct pci_info {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, struct pci_info *pci) {
    CHECK(device, "pci");
    memset(pci, 0, sizeof *pci);
    pci->bus = 0x18 + g->index;
    pci->pci_device_id = 0x233510de;
    snprintf(pci->bus_id, sizeof pci->bus_id, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->bus_id_legacy, sizeof pci->bus_id_legacy, "0000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(void *device, unsigned *node) {
    CHECK(device, "numa");
    *node = g->index / 4;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    CHECK(device, "capability");
    (void)g;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, unsigned *rates) {
    CHECK(device, "utilization");
    rates[0] = g->util_gpu;
    rates[1] = g->util_mem;
    return NVML_SUCCESS;
}

struct memory_v2 {
    unsigned version;
    unsigned long long total, reserved, free, used;
};

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, struct memory_v2 *memory) {
    CHECK(device, "memory");
    memory->total = g->total;
    memory->reserved = 1ULL << 30;
    memory->used = g->used;
    memory->free = g->total - g->used - memory->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(void *device, int type, unsigned *mhz) {
    CHECK(device, "clocks");
    *mhz = type == 2 ? g->mem_clock : g->sm_clock;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(void *device, int type, unsigned *mhz) {
    CHECK(device, "clocks");
    *mhz = type == 2 ? g->mem_max : g->sm_max;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned *celsius) {
    CHECK(device, "temperature");
    (void)sensor;
    *celsius = g->temp_gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void *device, int type, unsigned *celsius) {
    CHECK(device, "temperature");
    enum { SHUTDOWN = 0, SLOWDOWN = 1 };
    if (g->slowdown == 0 || (type != SHUTDOWN && type != SLOWDOWN)) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *celsius = type == SLOWDOWN ? g->slowdown : g->slowdown + 8;
    return NVML_SUCCESS;
}

#define SAMPLE_PERIOD_US 166667ULL
#define SAMPLES_KEPT_US 10000000ULL
#define MAX_INTERVALS 4096

/* The `gpu_compute` intervals of an ml-workload log (Unix µs) and the end of the last phase
 * logged; 0 intervals and end 0 when it cannot be read. */
static unsigned long long busy_from[MAX_INTERVALS], busy_to[MAX_INTERVALS];
static unsigned busy_count;
static unsigned long long read_busy_log(const char *path) {
    unsigned long long logged = 0;
    busy_count = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        return 0;
    }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *start = strstr(line, "\"start_ms\":"), *end = strstr(line, "\"end_ms\":");
        if (!start || !end || !strchr(line, '\n')) {
            continue; /* not a phase line, or one still being written */
        }
        unsigned long long from = strtoull(start + 11, NULL, 10) * 1000, to = strtoull(end + 9, NULL, 10) * 1000;
        if (to > logged) {
            logged = to;
        }
        if (strstr(line, "\"phase\":\"gpu_compute\"") && busy_count < MAX_INTERVALS) {
            busy_from[busy_count] = from;
            busy_to[busy_count++] = to;
        }
    }
    fclose(f);
    return logged;
}

struct sample {
    unsigned long long timestamp;
    union {
        double d;
        unsigned ui;
        unsigned long long ull;
    } value;
};

nvmlReturn_t nvmlDeviceGetSamples(void *device, int type, unsigned long long last_seen, int *value_type,
                                  unsigned *count, struct sample *samples) {
    CHECK(device, "samples");
    enum { GPU_UTILIZATION_SAMPLES = 1, VALUE_TYPE_UNSIGNED_INT = 1 };
    if (type != GPU_UTILIZATION_SAMPLES) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    const unsigned most = (unsigned)(SAMPLES_KEPT_US / SAMPLE_PERIOD_US);
    *value_type = VALUE_TYPE_UNSIGNED_INT;
    if (samples == NULL) {
        *count = most;
        return NVML_SUCCESS;
    }
    struct timespec now_ts;
    clock_gettime(CLOCK_REALTIME, &now_ts);
    unsigned long long now = (unsigned long long)now_ts.tv_sec * 1000000ULL + now_ts.tv_nsec / 1000;
    unsigned long long newest = now;
    if (g->busy_log[0]) {
        unsigned long long logged = read_busy_log(g->busy_log);
        newest = logged < now ? logged : now;
    }
    unsigned long long oldest = now - SAMPLES_KEPT_US;
    if (last_seen > oldest) {
        oldest = last_seen;
    }
    unsigned n = 0;
    for (unsigned long long t = (oldest / SAMPLE_PERIOD_US + 1) * SAMPLE_PERIOD_US; t <= newest && n < *count && n < most;
         t += SAMPLE_PERIOD_US) {
        unsigned busy = g->util_gpu;
        if (g->busy_log[0]) {
            unsigned long long covered = 0, from = t - SAMPLE_PERIOD_US;
            for (unsigned i = 0; i < busy_count; i++) {
                unsigned long long a = busy_from[i] > from ? busy_from[i] : from;
                unsigned long long b = busy_to[i] < t ? busy_to[i] : t;
                covered += b > a ? b - a : 0;
            }
            busy = (unsigned)(covered * 100 / SAMPLE_PERIOD_US);
        }
        samples[n].timestamp = t;
        samples[n].value.ull = 0;
        samples[n].value.ui = busy;
        n++;
    }
    *count = n;
    return n == 0 ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned *mw) {
    CHECK(device, "power");
    *mw = g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *device, unsigned *mw) {
    CHECK(device, "power");
    *mw = g->limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *device, unsigned long long *mj) {
    CHECK(device, "energy");
    /* Grows with time, as the real counter does. */
    *mj = (unsigned long long)time(NULL) % 100000 * (unsigned long long)g->power_mw / 1000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned *kb_per_s) {
    CHECK(device, "pcie");
    *kb_per_s = counter == 0 ? 1000 + g->index : 2000 + g->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(void *device, unsigned *count) {
    CHECK(device, "pcie");
    (void)g;
    *count = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *reasons) {
    CHECK(device, "throttle");
    *reasons = g->throttle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(void *device, int *current, int *pending) {
    CHECK(device, "ecc");
    (void)g;
    *current = 1;
    *pending = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int type, int counter, unsigned long long *count) {
    CHECK(device, "ecc");
    (void)counter;
    *count = type == 0 ? g->ecc_corrected : g->ecc_uncorrected;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(void *device, int cause, unsigned *count, unsigned long long *addresses) {
    CHECK(device, "retired");
    (void)g;
    (void)cause;
    (void)addresses;
    *count = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(void *device, int cause, unsigned *count, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    (void)timestamps;
    return nvmlDeviceGetRetiredPages(device, cause, count, addresses);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *device, int *pending) {
    CHECK(device, "retired");
    (void)g;
    *pending = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failed) {
    CHECK(device, "remapped");
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failed = g->remap_failed;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(void *device, int *mode) {
    CHECK(device, "persistence");
    (void)g;
    *mode = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeMode(void *device, int *mode) {
    CHECK(device, "compute_mode");
    (void)g;
    *mode = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPerformanceState(void *device, int *state) {
    CHECK(device, "pstate");
    *state = g->util_gpu > 0 ? 0 : 8;
    return NVML_SUCCESS;
}

struct process_info {
    unsigned pid;
    unsigned long long used_gpu_memory;
    unsigned gpu_instance_id, compute_instance_id;
};

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count, struct process_info *infos) {
    CHECK(device, "processes");
    if (infos == NULL || *count < g->process_count) {
        *count = g->process_count;
        return g->process_count == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < g->process_count; i++) {
        infos[i].pid = g->processes[i].pid;
        infos[i].used_gpu_memory = g->processes[i].memory;
        infos[i].gpu_instance_id = 0xffffffff;
        infos[i].compute_instance_id = 0xffffffff;
    }
    *count = g->process_count;
    return NVML_SUCCESS;
}

struct process_sample {
    unsigned pid;
    unsigned long long timestamp;
    unsigned sm, mem, enc, dec;
};

nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device, struct process_sample *samples, unsigned *count,
                                             unsigned long long since) {
    CHECK(device, "processes");
    (void)since;
    if (g->process_count == 0) {
        return NVML_ERROR_NOT_FOUND;
    }
    if (samples == NULL || *count < g->process_count) {
        *count = g->process_count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (unsigned i = 0; i < g->process_count; i++) {
        samples[i].pid = g->processes[i].pid;
        samples[i].timestamp = (unsigned long long)now.tv_sec * 1000000ULL + now.tv_nsec / 1000;
        samples[i].sm = g->processes[i].sm;
        samples[i].mem = g->processes[i].sm / 2;
        samples[i].enc = 0;
        samples[i].dec = 0;
    }
    *count = g->process_count;
    return NVML_SUCCESS;
}

struct field_value {
    unsigned field_id, scope_id;
    long long timestamp, latency_usec;
    int value_type;
    nvmlReturn_t nvml_return;
    union {
        double d;
        unsigned ui;
        unsigned long long ull;
    } value;
};

nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, struct field_value *values) {
    nvmlReturn_t rc = check(device, "fields");
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    struct gpu *g = device;
    for (int i = 0; i < count; i++) {
        struct field_value *v = &values[i];
        v->timestamp = (long long)time(NULL) * 1000000;
        v->nvml_return = NVML_SUCCESS;
        switch (v->field_id) {
        case 82: /* NVML_FI_DEV_MEMORY_TEMP */
            v->nvml_return = check(device, "memory_temp");
            v->value_type = 1;
            v->value.ui = g->temp_mem;
            break;
        case 91: /* NVML_FI_DEV_NVLINK_LINK_COUNT */
            v->nvml_return = check(device, "nvlink");
            v->value_type = 1;
            v->value.ui = 18;
            break;
        case 138: /* NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB */
        case 139: /* ..._RX */
            v->nvml_return = v->scope_id == 0xffffffffu ? check(device, "nvlink") : NVML_ERROR_INVALID_ARGUMENT;
            v->value_type = 3;
            v->value.ull = v->field_id == 138 ? 1024ULL * (g->index + 1) : 2048ULL * (g->index + 1);
            break;
        default:
            v->nvml_return = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* Events: one set (the daemon makes one); XIDs from the control file. */
enum { EVENT_DOUBLE_BIT_ECC = 0x2, EVENT_XID_CRITICAL = 0x8 };
static int event_set;

struct event_data {
    void *device;
    unsigned long long type, data;
    unsigned gpu_instance_id, compute_instance_id;
};

nvmlReturn_t nvmlEventSetCreate(void **set) {
    if (!initialised) {
        return NVML_ERROR_UNINITIALIZED;
    }
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    (void)set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    CHECK(device, "events");
    (void)g;
    *types = EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    CHECK(device, "events");
    (void)g;
    (void)types;
    return set == &event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, struct event_data *data, unsigned timeout_ms) {
    if (set != &event_set) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    load();
    for (unsigned i = 0; i < gpu_count; i++) {
        if (xids_delivered[i] < gpus[i].xid_count) {
            memset(data, 0, sizeof *data);
            data->device = &gpus[i];
            data->type = EVENT_XID_CRITICAL;
            data->data = gpus[i].xids[xids_delivered[i]++];
            return NVML_SUCCESS;
        }
    }
    struct timespec pause = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    return NVML_ERROR_TIMEOUT;
}
