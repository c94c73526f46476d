/*
 * libnvidia-ml.so.1 for machines without a GPU: an emulated NVML driver.
 *
 * The unmodified pynvml (nvidia-ml-py) loads this library by soname, so the
 * project's real NVML code path runs against GPU state and faults kept in files:
 *
 *   <node dir>/state    key=value lines, replaced atomically (temp file + rename)
 *                       by the testbed's fault injector; re-read when its stat
 *                       changes.  Absent file: 8 healthy GPUs.
 *   <node dir>/events   append-only, one event a line: "<gpu> xid <n>", "<gpu> dbe",
 *                       "<gpu> sbe", "<gpu> recovery <action>".  An event set sees
 *                       the lines appended after it was created.
 *
 * The node dir is $NVML_EMU_DIR, else $NVML_EMU_ROOT/<hostname>, else
 * <this library's dir>/../nvml/<hostname>; the hostname comes from the UTS
 * namespace, so every testbed host sees its own GPUs.  No node dir means no
 * driver: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a login node.
 *
 * NVML semantics kept on purpose (each one is something a health daemon must cope
 * with): every call on a lost GPU returns NVML_ERROR_GPU_IS_LOST and a wait on a
 * set holding a lost GPU returns it at once; registering an unsupported event type
 * returns NVML_ERROR_NOT_SUPPORTED and registers nothing; a wait that times out
 * returns NVML_ERROR_TIMEOUT; "hang.<function>=<deadline>" makes that call block
 * until the deadline (an injected driver hang), a CLOCK_MONOTONIC time: the one clock every
 * process, namespace and container on the machine shares that no one sets (an injector whose wall
 * clock is moved, as `pytest --clock-shift` does, still means the same instant).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef NVML_EMU_REAL_HEADER
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#else
#include "nvml_min.h"
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_HANGS 32
#define NVLINKS 18
#define SAFETY_POLL_MS 100 /* look again at least this often even without an inotify wake-up */

static const unsigned long long DEFAULT_EVENT_TYPES =
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
    nvmlEventTypeXidCriticalError | nvmlEventTypeClock;

struct gpu_state {
    int lost;
    unsigned long long ecc[2][2]; /* [counter type][error type] */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int retired[2], retired_pending;
    unsigned int temp;
    unsigned long long clocks_event_reasons;
    unsigned int sm_clock, sm_clock_max; /* MHz; sm_clock 0: at its maximum */
    unsigned long long nvlink_down_mask;
    unsigned long long nvlink_errors[NVLINKS][3]; /* replay, recovery, CRC flit */
    unsigned int pcie_width, pcie_gen; /* 0: at the maximum (x16, Gen5: an H100 SXM) */
    unsigned int recovery_action;
    unsigned long long event_types;
};

struct hang {
    char function[64];
    double deadline;
};

struct node_state {
    unsigned int gpus;
    char driver[32];
    struct gpu_state gpu[MAX_GPUS];
    struct hang hangs[MAX_HANGS];
    int nhangs;
};

struct nvmlDevice_st {
    unsigned int index;
};

struct nvmlEventSet_st {
    unsigned long long mask[MAX_GPUS];
    off_t offset;
    char partial[256];
    size_t partial_len;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static char node_dir[PATH_MAX + 96];
static char hostname[65];
static struct node_state state;
static struct stat state_stat;
static int state_loaded;
static struct nvmlDevice_st devices[MAX_GPUS];

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void defaults(struct node_state *s) {
    memset(s, 0, sizeof(*s));
    s->gpus = 8;
    snprintf(s->driver, sizeof(s->driver), "550.54.15");
    for (int i = 0; i < MAX_GPUS; i++) {
        s->gpu[i].temp = 38;
        s->gpu[i].sm_clock_max = 1980; /* an H100 SXM's maximum SM clock */
        s->gpu[i].event_types = DEFAULT_EVENT_TYPES;
    }
}

static void set_gpu_key(struct gpu_state *g, const char *key, const char *value) {
    unsigned long long v = strtoull(value, NULL, 0);
    if (!strcmp(key, "lost")) g->lost = (int)v;
    else if (!strcmp(key, "ecc.volatile.sbe")) g->ecc[0][0] = v;
    else if (!strcmp(key, "ecc.volatile.dbe")) g->ecc[0][1] = v;
    else if (!strcmp(key, "ecc.aggregate.sbe")) g->ecc[1][0] = v;
    else if (!strcmp(key, "ecc.aggregate.dbe")) g->ecc[1][1] = v;
    else if (!strcmp(key, "remap.corr")) g->remap_corr = (unsigned)v;
    else if (!strcmp(key, "remap.unc")) g->remap_unc = (unsigned)v;
    else if (!strcmp(key, "remap.pending")) g->remap_pending = (unsigned)v;
    else if (!strcmp(key, "remap.failure")) g->remap_failure = (unsigned)v;
    else if (!strcmp(key, "retired.sbe")) g->retired[0] = (unsigned)v;
    else if (!strcmp(key, "retired.dbe")) g->retired[1] = (unsigned)v;
    else if (!strcmp(key, "retired.pending")) g->retired_pending = (unsigned)v;
    else if (!strcmp(key, "temp")) g->temp = (unsigned)v;
    else if (!strcmp(key, "clocks_event_reasons")) g->clocks_event_reasons = v;
    else if (!strcmp(key, "clocks.sm")) g->sm_clock = (unsigned)v;
    else if (!strcmp(key, "clocks.sm.max")) g->sm_clock_max = (unsigned)v;
    else if (!strcmp(key, "nvlink.down")) g->nvlink_down_mask = v;
    else if (!strcmp(key, "pcie.width")) g->pcie_width = (unsigned)v;
    else if (!strcmp(key, "pcie.gen")) g->pcie_gen = (unsigned)v;
    else if (!strncmp(key, "nvlink.", 7)) {
        /* nvlink.<link>.<replay|recovery|crc>: that link's error counter */
        char *end;
        unsigned long link = strtoul(key + 7, &end, 10);
        static const char *const names[3] = {"replay", "recovery", "crc"};
        for (int i = 0; i < 3 && *end == '.' && end != key + 7 && link < NVLINKS; i++)
            if (!strcmp(end + 1, names[i])) g->nvlink_errors[link][i] = v;
    }
    else if (!strcmp(key, "recovery_action")) g->recovery_action = (unsigned)v;
    else if (!strcmp(key, "event_types")) g->event_types = v;
}

static void parse_line(struct node_state *s, char *line) {
    char *eq = strchr(line, '=');
    if (!eq || line[0] == '#') return;
    *eq = '\0';
    const char *key = line, *value = eq + 1;
    if (!strcmp(key, "gpus")) {
        unsigned long n = strtoul(value, NULL, 10);
        s->gpus = n > MAX_GPUS ? MAX_GPUS : (unsigned)n;
    } else if (!strcmp(key, "driver")) {
        snprintf(s->driver, sizeof(s->driver), "%s", value);
    } else if (!strncmp(key, "gpu.", 4)) {
        char *end;
        unsigned long idx = strtoul(key + 4, &end, 10);
        if (*end == '.' && idx < MAX_GPUS) set_gpu_key(&s->gpu[idx], end + 1, value);
    } else if (!strncmp(key, "hang.", 5) && s->nhangs < MAX_HANGS) {
        struct hang *h = &s->hangs[s->nhangs++];
        snprintf(h->function, sizeof(h->function), "%.63s", key + 5);
        h->deadline = strtod(value, NULL);
    }
}

/* Re-read the state file when it changed.  Call with `lock` held. */
static void refresh_state(void) {
    char path[sizeof(node_dir) + 16];
    struct stat st;
    snprintf(path, sizeof(path), "%s/state", node_dir);
    if (stat(path, &st) != 0) {
        if (!state_loaded || state_stat.st_ino != 0) {
            defaults(&state);
            memset(&state_stat, 0, sizeof(state_stat));
            state_loaded = 1;
        }
        return;
    }
    if (state_loaded && st.st_ino == state_stat.st_ino && st.st_size == state_stat.st_size &&
        st.st_mtim.tv_sec == state_stat.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == state_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    struct node_state fresh;
    defaults(&fresh);
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\r\n")] = '\0';
            parse_line(&fresh, line);
        }
        fclose(f);
    }
    state = fresh;
    state_stat = st;
    state_loaded = 1;
}

/* Block while an injected hang for `function` is in force ("hang.<function>"). */
static void maybe_hang(const char *function) {
    for (;;) {
        double deadline = 0;
        pthread_mutex_lock(&lock);
        refresh_state();
        for (int i = 0; i < state.nhangs; i++)
            if (!strcmp(state.hangs[i].function, function)) deadline = state.hangs[i].deadline;
        pthread_mutex_unlock(&lock);
        if (deadline <= monotonic_seconds()) return;
        /* Re-check every 50 ms so that clearing the fault releases the caller early. */
        struct timespec pause = {0, 50000000L};
        nanosleep(&pause, NULL);
    }
}

/* Look a device up and copy its state; returns the NVML status of the call. */
static nvmlReturn_t device_state(const char *function, nvmlDevice_t device, struct gpu_state *out) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_hang(function);
    pthread_mutex_lock(&lock);
    refresh_state();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (device->index >= state.gpus) rc = NVML_ERROR_GPU_IS_LOST;
    else if (state.gpu[device->index].lost) rc = NVML_ERROR_GPU_IS_LOST;
    else if (out) *out = state.gpu[device->index];
    pthread_mutex_unlock(&lock);
    return rc;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* The bus numbers of a DGX H100's eight GPUs; further GPUs continue upwards. */
static unsigned int pci_bus(unsigned int index) {
    static const unsigned int bus[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};
    return index < 8 ? bus[index] : 0xe0 + index;
}

static unsigned long fnv1a(const char *s, unsigned int salt) {
    unsigned long h = 1469598103934665603UL ^ salt;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211UL;
    return h;
}

static void uuid_of(unsigned int index, char *out, size_t len) {
    unsigned long a = fnv1a(hostname, index), b = fnv1a(hostname, index + 1000);
    snprintf(out, len, "GPU-%08lx-%04lx-%04lx-%04lx-%012lx", a & 0xffffffffUL, (a >> 32) & 0xffff,
             (a >> 48) & 0xffff, b & 0xffff, (b >> 16) & 0xffffffffffffUL);
}

static int resolve_node_dir(void) {
    struct utsname u;
    if (uname(&u) != 0) return -1;
    snprintf(hostname, sizeof(hostname), "%s", u.nodename);
    const char *dir = getenv("NVML_EMU_DIR");
    const char *root = getenv("NVML_EMU_ROOT");
    if (dir && *dir) {
        snprintf(node_dir, sizeof(node_dir), "%s", dir);
    } else if (root && *root) {
        snprintf(node_dir, sizeof(node_dir), "%s/%s", root, hostname);
    } else {
        Dl_info info;
        char self[PATH_MAX];
        if (!dladdr((void *)resolve_node_dir, &info) || !info.dli_fname) return -1;
        if (!realpath(info.dli_fname, self)) return -1;
        char *slash = strrchr(self, '/');
        if (slash) *slash = '\0';
        snprintf(node_dir, sizeof(node_dir), "%s/../nvml/%s", self, hostname);
    }
    struct stat st;
    return stat(node_dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* ---- initialisation and system queries ---------------------------------------- */

EXPORT nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    maybe_hang("nvmlInit");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (init_count == 0 && resolve_node_dir() != 0) rc = NVML_ERROR_DRIVER_NOT_LOADED;
    if (rc == NVML_SUCCESS) {
        for (unsigned int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
        state_loaded = 0;
        refresh_state();
        init_count++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t DECLDIR nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count) init_count--;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT const char *DECLDIR nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&lock);
    refresh_state();
    char copy[32];
    snprintf(copy, sizeof(copy), "%s", state.driver);
    pthread_mutex_unlock(&lock);
    return copy_string(version, length, copy);
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, "12.550.54.15");
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = 12040;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices ---------------------------------------------------------------- */

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_hang("nvmlDeviceGetCount");
    pthread_mutex_lock(&lock);
    refresh_state();
    *deviceCount = state.gpus;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_hang("nvmlDeviceGetHandleByIndex");
    pthread_mutex_lock(&lock);
    refresh_state();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (index >= state.gpus) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (state.gpu[index].lost) rc = NVML_ERROR_GPU_IS_LOST;
    else *device = &devices[index];
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < state.gpus; i++) {
        char candidate[NVML_DEVICE_UUID_BUFFER_SIZE];
        uuid_of(i, candidate, sizeof(candidate));
        if (!strcmp(candidate, uuid)) return nvmlDeviceGetHandleByIndex_v2(i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    /* Accept both "0000:18:00.0" and the long "00000000:18:00.0" form. */
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) < 3) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < state.gpus; i++)
        if (pci_bus(i) == bus && domain == 0 && dev == 0) return nvmlDeviceGetHandleByIndex_v2(i, device);
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetIndex", device, NULL);
    if (rc == NVML_SUCCESS && index) *index = device->index;
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetMinorNumber", device, NULL);
    if (rc == NVML_SUCCESS && minorNumber) *minorNumber = device->index;
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetName", device, NULL);
    return rc == NVML_SUCCESS ? copy_string(name, length, "NVIDIA H100 80GB HBM3") : rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetUUID", device, NULL);
    if (rc != NVML_SUCCESS) return rc;
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    uuid_of(device->index, text, sizeof(text));
    return copy_string(uuid, length, text);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetSerial", device, NULL);
    if (rc != NVML_SUCCESS) return rc;
    char text[32];
    snprintf(text, sizeof(text), "%013lu", fnv1a(hostname, device->index + 2000) % 10000000000000UL);
    return copy_string(serial, length, text);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetPciInfo", device, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->domain = 0;
    pci->bus = pci_bus(device->index);
    pci->device = 0;
    pci->pciDeviceId = 0x233010de; /* H100 SXM5, vendor 10de */
    pci->pciSubSystemId = 0x16c110de;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

/* ---- memory health ---------------------------------------------------------- */

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                                 nvmlEnableState_t *pending) {
    nvmlReturn_t rc = device_state("nvmlDeviceGetEccMode", device, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                        nvmlEccCounterType_t counterType,
                                                        unsigned long long *eccCounts) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetTotalEccErrors", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!eccCounts || (unsigned)errorType > 1 || (unsigned)counterType > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = g.ecc[counterType][errorType];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                                      unsigned int *uncRows, unsigned int *isPending,
                                                      unsigned int *failureOccurred) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetRemappedRows", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    *corrRows = g.remap_corr;
    *uncRows = g.remap_unc;
    *isPending = g.remap_pending;
    *failureOccurred = g.remap_failure;
    return NVML_SUCCESS;
}

static nvmlReturn_t retired_pages(const char *function, nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                  unsigned int *pageCount, unsigned long long *addresses,
                                  unsigned long long *timestamps) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state(function, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!pageCount || (unsigned)cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = g.retired[cause];
    /* NVML's size protocol: report the count, fail with INSUFFICIENT_SIZE if it does not fit. */
    if (*pageCount < n || (!addresses && n > 0)) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = 0x1000ULL * (i + 1) + ((unsigned long long)cause << 40);
        if (timestamps) timestamps[i] = 1700000000ULL + i;
    }
    *pageCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                      unsigned int *pageCount, unsigned long long *addresses) {
    return retired_pages("nvmlDeviceGetRetiredPages", device, cause, pageCount, addresses, NULL);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                         unsigned int *pageCount, unsigned long long *addresses,
                                                         unsigned long long *timestamps) {
    return retired_pages("nvmlDeviceGetRetiredPages", device, cause, pageCount, addresses, timestamps);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                                   nvmlEnableState_t *isPending) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetRetiredPagesPendingStatus", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!isPending) return NVML_ERROR_INVALID_ARGUMENT;
    *isPending = g.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- thermal, clocks, NVLink, field values ---------------------------------- */

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                     unsigned int *temp) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetTemperature", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g.temp;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                                   unsigned long long *clocksEventReasons) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetCurrentClocksEventReasons", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!clocksEventReasons) return NVML_ERROR_INVALID_ARGUMENT;
    *clocksEventReasons = g.clocks_event_reasons;
    return NVML_SUCCESS;
}

/* SM and graphics clocks come from the state file (`gpu.<i>.clocks.sm`, `.clocks.sm.max`); memory and
 * video clocks are fixed.  A throttled GPU (the `throttle` fault) reports a lower SM clock. */
static unsigned int clock_of(const struct gpu_state *g, nvmlClockType_t type, int max) {
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
        return max || g->sm_clock == 0 || g->sm_clock > g->sm_clock_max ? g->sm_clock_max : g->sm_clock;
    case NVML_CLOCK_MEM: return 2619;
    case NVML_CLOCK_VIDEO: return 1755;
    default: return 0;
    }
}

static nvmlReturn_t clock_query(const char *name, nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                                int max) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state(name, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!clock || (int)type < 0 || type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *clock = clock_of(&g, type, max);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return clock_query("nvmlDeviceGetClockInfo", device, type, clock, 0);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                      unsigned int *clock) {
    return clock_query("nvmlDeviceGetMaxClockInfo", device, type, clock, 1);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                      unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                     nvmlEnableState_t *isActive) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetNvLinkState", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!isActive || link >= NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = (g.nvlink_down_mask >> link) & 1ULL ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                            nvmlNvLinkErrorCounter_t counter,
                                                            unsigned long long *counterValue) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetNvLinkErrorCounter", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!counterValue || link >= NVLINKS || (int)counter < 0 || counter >= NVML_NVLINK_ERROR_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* CRC data and ECC data counters stay 0 (the emulated faults raise the flit CRC counter) */
    *counterValue = counter <= NVML_NVLINK_ERROR_DL_CRC_FLIT ? g.nvlink_errors[link][counter] : 0;
    return NVML_SUCCESS;
}

#define PCIE_MAX_WIDTH 16
#define PCIE_MAX_GEN 5

static nvmlReturn_t pcie_query(const char *name, nvmlDevice_t device, unsigned int *out, int gen, int max) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state(name, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int top = gen ? PCIE_MAX_GEN : PCIE_MAX_WIDTH, current = gen ? g.pcie_gen : g.pcie_width;
    *out = max || current == 0 || current > top ? top : current;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth) {
    return pcie_query("nvmlDeviceGetCurrPcieLinkWidth", device, currLinkWidth, 0, 0);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth) {
    return pcie_query("nvmlDeviceGetMaxPcieLinkWidth", device, maxLinkWidth, 0, 1);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen) {
    return pcie_query("nvmlDeviceGetCurrPcieLinkGeneration", device, currLinkGen, 1, 0);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen) {
    return pcie_query("nvmlDeviceGetMaxPcieLinkGeneration", device, maxLinkGen, 1, 1);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                                     nvmlFieldValue_t *values) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetFieldValues", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!values || valuesCount < 0) return NVML_ERROR_INVALID_ARGUMENT;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)tv.tv_sec * 1000000LL + tv.tv_usec;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->nvmlReturn = NVML_SUCCESS;
        switch (v->fieldId) {
        case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: v->value.uiVal = g.recovery_action; break;
        case NVML_FI_DEV_NVLINK_LINK_COUNT: v->value.uiVal = NVLINKS; break;
        default: v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; break;
        }
    }
    return NVML_SUCCESS;
}

/* ---- events ----------------------------------------------------------------- */

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceGetSupportedEventTypes", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = g.event_types;
    return NVML_SUCCESS;
}

static off_t events_size(void) {
    char path[sizeof(node_dir) + 16];
    struct stat st;
    snprintf(path, sizeof(path), "%s/events", node_dir);
    return stat(path, &st) == 0 ? st.st_size : 0;
}

EXPORT nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s) return NVML_ERROR_UNKNOWN;
    s->offset = events_size();
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                     nvmlEventSet_t set) {
    struct gpu_state g;
    nvmlReturn_t rc = device_state("nvmlDeviceRegisterEvents", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~g.event_types) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[device->index] |= eventTypes;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

/* Turn one events-file line into an event for `set`; 1 if it is one the set wants. */
static int match_event(nvmlEventSet_t set, const char *line, nvmlEventData_t *data) {
    unsigned int gpu;
    char kind[16] = "";
    unsigned long long value = 0;
    if (sscanf(line, "%u %15s %llu", &gpu, kind, &value) < 2 || gpu >= MAX_GPUS) return 0;
    unsigned long long type;
    if (!strcmp(kind, "xid")) type = nvmlEventTypeXidCriticalError;
    else if (!strcmp(kind, "dbe")) type = nvmlEventTypeDoubleBitEccError, value = 0;
    else if (!strcmp(kind, "sbe")) type = nvmlEventTypeSingleBitEccError, value = 0;
    else if (!strcmp(kind, "recovery")) type = nvmlEventTypeGpuRecoveryAction;
    else if (!strcmp(kind, "unavailable")) type = nvmlEventTypeGpuUnavailableError, value = 0;
    else return 0;
    if (!(set->mask[gpu] & type)) return 0;
    memset(data, 0, sizeof(*data));
    data->device = &devices[gpu];
    data->eventType = type;
    data->eventData = value;
    data->gpuInstanceId = 0xFFFFFFFFu;
    data->computeInstanceId = 0xFFFFFFFFu;
    return 1;
}

/* Read what was appended since the set's offset; deliver the first wanted event. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    char path[sizeof(node_dir) + 16];
    struct stat st;
    snprintf(path, sizeof(path), "%s/events", node_dir);
    /* Nothing appended since the last look: one stat(), no open/read (this runs every poll). */
    if (stat(path, &st) != 0 || st.st_size <= set->offset) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[4096];
    int found = 0;
    while (!found) {
        ssize_t n = pread(fd, buf, sizeof(buf), set->offset);
        if (n <= 0) break;
        ssize_t used = 0;
        for (ssize_t i = 0; i < n && !found; i++) {
            used = i + 1;
            if (buf[i] != '\n') {
                if (set->partial_len < sizeof(set->partial) - 1) set->partial[set->partial_len++] = buf[i];
                continue;
            }
            set->partial[set->partial_len] = '\0';
            found = match_event(set, set->partial, data);
            set->partial_len = 0;
        }
        set->offset += used;
    }
    close(fd);
    return found;
}

static int set_has_lost_gpu(nvmlEventSet_t set) {
    int lost = 0;
    pthread_mutex_lock(&lock);
    refresh_state();
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        if (set->mask[i] && (i >= state.gpus || state.gpu[i].lost)) lost = 1;
    pthread_mutex_unlock(&lock);
    return lost;
}

EXPORT nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_hang("nvmlEventSetWait");
    /* Block in the kernel like the real driver: inotify on the node directory wakes us when the
     * events file grows or the state file is replaced (a GPU lost), instead of polling. */
    int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (watch >= 0) inotify_add_watch(watch, node_dir, IN_MODIFY | IN_MOVED_TO | IN_CREATE | IN_CLOSE_WRITE);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    nvmlReturn_t rc;
    for (;;) {
        if (next_event(set, data)) { rc = NVML_SUCCESS; break; }
        if (set_has_lost_gpu(set)) { rc = NVML_ERROR_GPU_IS_LOST; break; }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed_ms = (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
        if (elapsed_ms >= (long)timeoutms) { rc = NVML_ERROR_TIMEOUT; break; }
        long wait_ms = (long)timeoutms - elapsed_ms;
        if (wait_ms > SAFETY_POLL_MS) wait_ms = SAFETY_POLL_MS;
        if (watch >= 0) {
            struct pollfd pfd = {watch, POLLIN, 0};
            if (poll(&pfd, 1, (int)wait_ms) > 0) {
                char buf[4096];
                while (read(watch, buf, sizeof(buf)) > 0) {
                }
            }
        } else {
            struct timespec pause = {0, 2000000L}; /* no inotify: fall back to a 2 ms poll */
            nanosleep(&pause, NULL);
        }
    }
    if (watch >= 0) close(watch);
    return rc;
}
