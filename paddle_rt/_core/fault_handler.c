/* Fatal signals inside a plugin hook: one line naming the plugin, the hook and the device, then whatever handler was
 * installed before (Python's faulthandler, a sanitizer, the default action).
 *
 * Part of libpaddle_rt_host.so, which paddle_rt loads once with RTLD_GLOBAL before any plugin, so this state exists
 * once per process. Nothing here runs on paddle_rt's hot paths except the set_device trampoline (one thread-local
 * store before the plugin's own set_device), which records the device each thread last made current; every plugin
 * call paddle_rt makes is preceded by a set_device on that thread.
 *
 * Finding the hook: the handler walks the faulting thread's stack (backtrace(), primed at install so it does not
 * load libgcc_s inside the handler), takes the outermost frame inside a registered plugin's code whose caller is
 * paddle_rt's own code, and names the hook whose function contains that address: the plugin's symbol table (.symtab,
 * else .dynsym; read from its file at registration) gives each function's range, and a part gcc moved out of a hook
 * (`hook.cold`, `hook.part.0`, `hook.isra.0`, `hook.constprop.0`: the abort paths of -O2/-O3 builds) counts as the
 * hook itself. Without symbols, the hook whose entry point is the closest one at or below the address. A caller's
 * frame is looked up one byte before its return address; the faulting frame (its address is the signal context's
 * pc) at that address itself, so a hook that faults on its first instruction is named, not the function before it.
 * Output uses write(2) only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdatomic.h>
#include <ucontext.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "paddle_rt/device_ext.h"

#define PRT_FH_EXPORT __attribute__((visibility("default")))
#define PRT_FH_MAX_PLUGINS 32
#define PRT_FH_MAX_HOOKS 128
#define PRT_FH_NAME 48
#define PRT_FH_PATH 512
#define PRT_FH_MAX_DEVICES 64
#define PRT_FH_FRAMES 64
#define PRT_FH_MAX_RANGES 256
#define PRT_FH_ST_TYPE(info) ((info) & 0xf) /* ELF32_ST_TYPE and ELF64_ST_TYPE alike */

typedef C_Status (*prt_set_device_fn)(const C_Device device);

typedef struct {
  char name[PRT_FH_NAME]; /* device type */
  char path[PRT_FH_PATH];
  uintptr_t lo, hi;       /* executable segments of the plugin's shared object */
  size_t n_hooks;
  uintptr_t hook_addr[PRT_FH_MAX_HOOKS];
  char hook_name[PRT_FH_MAX_HOOKS][PRT_FH_NAME];
  size_t n_devices;
  int64_t device_id[PRT_FH_MAX_DEVICES]; /* physical ids, by paddle_rt's device index */
  prt_set_device_fn set_device;          /* the plugin's own */
  size_t n_ranges;                       /* functions of the hooks, their outlined parts included (symbols) */
  uintptr_t range_lo[PRT_FH_MAX_RANGES], range_hi[PRT_FH_MAX_RANGES];
  uint16_t range_hook[PRT_FH_MAX_RANGES];
} prt_fh_plugin;

static prt_fh_plugin g_plugins[PRT_FH_MAX_PLUGINS];
static atomic_int g_n_plugins;
static atomic_int g_installed;
static atomic_int g_reported;
static __thread int t_plugin = -1;    /* the plugin whose set_device this thread called last */
static __thread int64_t t_device = -1; /* the physical id it was given */

static const int k_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define PRT_FH_NSIG ((int)(sizeof(k_signals) / sizeof(k_signals[0])))
static struct sigaction g_previous[PRT_FH_NSIG];

/* -- set_device trampolines: one per plugin slot ------------------------------------------------------------------ */
#define PRT_FH_TRAMPOLINE(i)                                               \
  static C_Status prt_fh_set_device_##i(const C_Device device) {          \
    t_plugin = i;                                                          \
    t_device = device != NULL ? (int64_t)device->id : -1;                  \
    return g_plugins[i].set_device(device);                                \
  }
PRT_FH_TRAMPOLINE(0) PRT_FH_TRAMPOLINE(1) PRT_FH_TRAMPOLINE(2) PRT_FH_TRAMPOLINE(3)
PRT_FH_TRAMPOLINE(4) PRT_FH_TRAMPOLINE(5) PRT_FH_TRAMPOLINE(6) PRT_FH_TRAMPOLINE(7)
PRT_FH_TRAMPOLINE(8) PRT_FH_TRAMPOLINE(9) PRT_FH_TRAMPOLINE(10) PRT_FH_TRAMPOLINE(11)
PRT_FH_TRAMPOLINE(12) PRT_FH_TRAMPOLINE(13) PRT_FH_TRAMPOLINE(14) PRT_FH_TRAMPOLINE(15)
PRT_FH_TRAMPOLINE(16) PRT_FH_TRAMPOLINE(17) PRT_FH_TRAMPOLINE(18) PRT_FH_TRAMPOLINE(19)
PRT_FH_TRAMPOLINE(20) PRT_FH_TRAMPOLINE(21) PRT_FH_TRAMPOLINE(22) PRT_FH_TRAMPOLINE(23)
PRT_FH_TRAMPOLINE(24) PRT_FH_TRAMPOLINE(25) PRT_FH_TRAMPOLINE(26) PRT_FH_TRAMPOLINE(27)
PRT_FH_TRAMPOLINE(28) PRT_FH_TRAMPOLINE(29) PRT_FH_TRAMPOLINE(30) PRT_FH_TRAMPOLINE(31)

static const prt_set_device_fn k_trampolines[PRT_FH_MAX_PLUGINS] = {
    prt_fh_set_device_0,  prt_fh_set_device_1,  prt_fh_set_device_2,  prt_fh_set_device_3,
    prt_fh_set_device_4,  prt_fh_set_device_5,  prt_fh_set_device_6,  prt_fh_set_device_7,
    prt_fh_set_device_8,  prt_fh_set_device_9,  prt_fh_set_device_10, prt_fh_set_device_11,
    prt_fh_set_device_12, prt_fh_set_device_13, prt_fh_set_device_14, prt_fh_set_device_15,
    prt_fh_set_device_16, prt_fh_set_device_17, prt_fh_set_device_18, prt_fh_set_device_19,
    prt_fh_set_device_20, prt_fh_set_device_21, prt_fh_set_device_22, prt_fh_set_device_23,
    prt_fh_set_device_24, prt_fh_set_device_25, prt_fh_set_device_26, prt_fh_set_device_27,
    prt_fh_set_device_28, prt_fh_set_device_29, prt_fh_set_device_30, prt_fh_set_device_31,
};

/* -- registration (with the GIL, from plugin loading) ------------------------------------------------------------- */
typedef struct {
  uintptr_t probe;
  uintptr_t lo, hi, bias;
  int found;
} prt_fh_range_query;

static int prt_fh_find_range(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  prt_fh_range_query* q = (prt_fh_range_query*)data;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  int contains = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t a = (uintptr_t)info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
    if (a < lo) lo = a;
    if (b > hi) hi = b;
    if (q->probe >= a && q->probe < b) contains = 1;
  }
  if (!contains) return 0;
  q->lo = lo;
  q->hi = hi;
  q->bias = (uintptr_t)info->dlpi_addr;
  q->found = 1;
  return 1;
}

static void prt_fh_copy(char* dst, const char* src, size_t cap) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap) n = cap - 1;
  if (n) memcpy(dst, src, n);
  dst[n] = '\0';
}

/* The length of a function symbol's name without gcc's suffixes for outlined parts (".cold", ".part.N", ".isra.N",
 * ".constprop.N", ...): everything from the first '.' on. */
static size_t prt_fh_base_len(const char* name, size_t max) {
  size_t n = 0;
  while (n < max && name[n] && name[n] != '.') n++;
  return n;
}

/* From the plugin's ELF file: the range of every function whose name, suffixes folded, is the name of a hook's
 * function (found by the hook's address). Best effort: a file that cannot be read leaves no ranges. */
static void prt_fh_read_symbols(prt_fh_plugin* p, uintptr_t bias) {
  int fd = open(p->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(ElfW(Ehdr))) {
    close(fd);
    return;
  }
  size_t size = (size_t)st.st_size;
  const unsigned char* m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return;
  const ElfW(Ehdr)* eh = (const ElfW(Ehdr)*)m;
  const ElfW(Shdr)* sym_sh = NULL;
  const ElfW(Shdr)* sh = NULL;
  int elf_class = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != elf_class ||
      eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff == 0 || eh->e_shoff > size ||
      (size - eh->e_shoff) / sizeof(ElfW(Shdr)) < eh->e_shnum)
    goto done;
  sh = (const ElfW(Shdr)*)(m + eh->e_shoff);
  for (int pass = 0; pass < 2 && !sym_sh; pass++) /* .symtab (every function), else .dynsym (the exported ones) */
    for (size_t i = 0; i < eh->e_shnum; i++)
      if (sh[i].sh_type == (pass == 0 ? SHT_SYMTAB : SHT_DYNSYM) && sh[i].sh_link < eh->e_shnum) sym_sh = &sh[i];
  if (!sym_sh || sym_sh->sh_entsize != sizeof(ElfW(Sym)) || sym_sh->sh_offset > size ||
      sym_sh->sh_size > size - sym_sh->sh_offset)
    goto done;
  const ElfW(Shdr)* str_sh = &sh[sym_sh->sh_link];
  if (str_sh->sh_offset > size || str_sh->sh_size > size - str_sh->sh_offset || str_sh->sh_size == 0) goto done;
  const ElfW(Sym)* syms = (const ElfW(Sym)*)(m + sym_sh->sh_offset);
  size_t nsyms = sym_sh->sh_size / sizeof(ElfW(Sym));
  const char* strs = (const char*)(m + str_sh->sh_offset);
  size_t strsz = str_sh->sh_size;
  /* the function of each hook: the symbol at its address */
  const char* hook_sym[PRT_FH_MAX_HOOKS];
  size_t hook_len[PRT_FH_MAX_HOOKS];
  for (size_t h = 0; h < p->n_hooks; h++) {
    hook_sym[h] = NULL;
    hook_len[h] = 0;
    for (size_t i = 0; i < nsyms; i++) {
      if (PRT_FH_ST_TYPE(syms[i].st_info) != STT_FUNC || syms[i].st_name >= strsz || syms[i].st_value == 0) continue;
      if (bias + syms[i].st_value != p->hook_addr[h]) continue;
      hook_sym[h] = strs + syms[i].st_name;
      hook_len[h] = prt_fh_base_len(hook_sym[h], strsz - syms[i].st_name);
      break;
    }
  }
  /* every function (outlined parts included) whose folded name is a hook's function */
  for (size_t i = 0; i < nsyms && p->n_ranges < PRT_FH_MAX_RANGES; i++) {
    if (PRT_FH_ST_TYPE(syms[i].st_info) != STT_FUNC || syms[i].st_name >= strsz || syms[i].st_size == 0) continue;
    const char* name = strs + syms[i].st_name;
    size_t len = prt_fh_base_len(name, strsz - syms[i].st_name);
    for (size_t h = 0; h < p->n_hooks; h++) {
      if (!hook_sym[h] || hook_len[h] != len || memcmp(hook_sym[h], name, len) != 0) continue;
      p->range_lo[p->n_ranges] = bias + syms[i].st_value;
      p->range_hi[p->n_ranges] = bias + syms[i].st_value + syms[i].st_size;
      p->range_hook[p->n_ranges] = (uint16_t)h;
      p->n_ranges++;
      break;
    }
  }
done:
  munmap((void*)m, size);
}

/* Register a loaded plugin: its interface table (the hooks at `offsets`, named `names`), and swap its set_device
 * for this slot's trampoline. Returns the slot, or -1 when the table is full or the plugin's code cannot be found
 * (nothing is changed then). */
PRT_FH_EXPORT int paddle_rt_fault_register(const char* name, const char* path, C_DeviceInterface* iface,
                                           const char* const* names, const size_t* offsets, size_t n) {
  int slot = atomic_load(&g_n_plugins);
  if (slot >= PRT_FH_MAX_PLUGINS || iface == NULL || iface->set_device == NULL) return -1;
  prt_fh_range_query q = {(uintptr_t)iface->set_device, 0, 0, 0, 0};
  dl_iterate_phdr(prt_fh_find_range, &q);
  if (!q.found) return -1;
  prt_fh_plugin* p = &g_plugins[slot];
  memset(p, 0, sizeof(*p));
  prt_fh_copy(p->name, name, sizeof(p->name));
  prt_fh_copy(p->path, path, sizeof(p->path));
  p->lo = q.lo;
  p->hi = q.hi;
  for (size_t i = 0; i < n && p->n_hooks < PRT_FH_MAX_HOOKS; i++) {
    void* fn;
    memcpy(&fn, (const char*)iface + offsets[i], sizeof(fn));
    if (fn == NULL) continue;
    p->hook_addr[p->n_hooks] = (uintptr_t)fn;
    prt_fh_copy(p->hook_name[p->n_hooks], names[i], PRT_FH_NAME);
    p->n_hooks++;
  }
  p->set_device = iface->set_device;
  prt_fh_read_symbols(p, q.bias);
  atomic_store(&g_n_plugins, slot + 1); /* published before the trampoline can run */
  iface->set_device = k_trampolines[slot];
  return slot;
}

/* The physical ids of a registered plugin's devices, by paddle_rt's index (to print "type:index"). */
PRT_FH_EXPORT void paddle_rt_fault_set_devices(int slot, const int64_t* ids, size_t n) {
  if (slot < 0 || slot >= atomic_load(&g_n_plugins)) return;
  if (n > PRT_FH_MAX_DEVICES) n = PRT_FH_MAX_DEVICES;
  for (size_t i = 0; i < n; i++) g_plugins[slot].device_id[i] = ids[i];
  g_plugins[slot].n_devices = n;
}

/* -- the handler (async-signal-safe output) ----------------------------------------------------------------------- */
static size_t prt_fh_put(char* buf, size_t at, size_t cap, const char* s) {
  while (s && *s && at + 1 < cap) buf[at++] = *s++;
  return at;
}

static size_t prt_fh_put_int(char* buf, size_t at, size_t cap, int64_t v) {
  char tmp[24];
  int n = 0;
  uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u && n < (int)sizeof(tmp));
  if (v < 0 && at + 1 < cap) buf[at++] = '-';
  while (n && at + 1 < cap) buf[at++] = tmp[--n];
  return at;
}

static const char* prt_fh_signame(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
  }
}

static int prt_fh_plugin_of(uintptr_t pc, int n_plugins) {
  for (int i = 0; i < n_plugins; i++)
    if (pc >= g_plugins[i].lo && pc < g_plugins[i].hi) return i;
  return -1;
}

static int prt_fh_is_ours(uintptr_t pc) {
  Dl_info info;
  if (!dladdr((void*)pc, &info) || info.dli_fname == NULL) return 0;
  return strstr(info.dli_fname, "/paddle_rt/") != NULL;
}

static const char* prt_fh_hook_at(const prt_fh_plugin* p, uintptr_t pc) {
  for (size_t i = 0; i < p->n_ranges; i++) /* the function containing pc, by the plugin's symbols */
    if (pc >= p->range_lo[i] && pc < p->range_hi[i]) return p->hook_name[p->range_hook[i]];
  if (p->n_ranges) return NULL; /* symbols known, pc in none of the hooks' functions */
  const char* best = NULL;
  uintptr_t best_addr = 0;
  for (size_t i = 0; i < p->n_hooks; i++) {
    if (p->hook_addr[i] <= pc && p->hook_addr[i] >= best_addr) {
      best_addr = p->hook_addr[i];
      best = p->hook_name[i];
    }
  }
  return best;
}

/* The pc of the instruction that faulted (from the signal's context), or 0 on an architecture not listed. */
static uintptr_t prt_fh_fault_pc(const void* uctx) {
  const ucontext_t* uc = (const ucontext_t*)uctx;
  if (uc == NULL) return 0;
#if defined(__x86_64__)
  return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__i386__)
  return (uintptr_t)uc->uc_mcontext.gregs[REG_EIP];
#elif defined(__aarch64__)
  return (uintptr_t)uc->uc_mcontext.pc;
#else
  return 0;
#endif
}

/* The address to look up for a frame of backtrace(): a return address points after its call, so one byte back keeps
 * a call at a function's end inside that function; the faulting frame's address is the faulting instruction itself
 * (not a return address), and one byte back from a hook's first instruction lands in the function before it. */
static uintptr_t prt_fh_frame_pc(void* frame, uintptr_t fault_pc) {
  uintptr_t at = (uintptr_t)frame;
  return (fault_pc != 0 && at == fault_pc) ? at : at - 1;
}

static void prt_fh_report(int sig, uintptr_t fault_pc) {
  int n_plugins = atomic_load(&g_n_plugins);
  void* frames[PRT_FH_FRAMES];
  int depth = backtrace(frames, PRT_FH_FRAMES);
  int plugin = -1, outer = -1;
  for (int i = 0; i < depth; i++) {
    int k = prt_fh_plugin_of(prt_fh_frame_pc(frames[i], fault_pc), n_plugins);
    if (k >= 0) {
      if (plugin < 0) plugin = k;
      if (k == plugin) outer = i;
    } else if (plugin >= 0) {
      break; /* left the plugin's code: `outer` is its outermost frame */
    }
  }
  if (plugin < 0) return; /* not inside a plugin: say nothing */
  const prt_fh_plugin* p = &g_plugins[plugin];
  const char* hook = NULL;
  if (outer + 1 < depth && prt_fh_is_ours((uintptr_t)frames[outer + 1] - 1))
    hook = prt_fh_hook_at(p, outer == 0 ? (uintptr_t)frames[0] : prt_fh_frame_pc(frames[outer], fault_pc));
  char line[1024];
  size_t at = 0, cap = sizeof(line);
  at = prt_fh_put(line, at, cap, "paddle_rt: fatal signal ");
  at = prt_fh_put(line, at, cap, prt_fh_signame(sig));
  at = prt_fh_put(line, at, cap, " inside plugin '");
  at = prt_fh_put(line, at, cap, p->name);
  at = prt_fh_put(line, at, cap, "' (");
  at = prt_fh_put(line, at, cap, p->path);
  at = prt_fh_put(line, at, cap, "), hook ");
  at = prt_fh_put(line, at, cap, hook ? hook : "unknown (not a call from paddle_rt)");
  at = prt_fh_put(line, at, cap, ", device ");
  if (t_plugin == plugin && t_device >= 0) {
    int64_t index = -1;
    for (size_t i = 0; i < p->n_devices; i++)
      if (p->device_id[i] == t_device) index = (int64_t)i;
    at = prt_fh_put(line, at, cap, p->name);
    at = prt_fh_put(line, at, cap, ":");
    if (index >= 0) {
      at = prt_fh_put_int(line, at, cap, index);
      at = prt_fh_put(line, at, cap, " (physical id ");
      at = prt_fh_put_int(line, at, cap, t_device);
      at = prt_fh_put(line, at, cap, ")");
    } else {
      at = prt_fh_put(line, at, cap, "? (physical id ");
      at = prt_fh_put_int(line, at, cap, t_device);
      at = prt_fh_put(line, at, cap, ")");
    }
  } else {
    at = prt_fh_put(line, at, cap, "unknown (no set_device on this thread)");
  }
  line[at++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, at);
  (void)ignored;
}

static void prt_fh_handler(int sig, siginfo_t* info, void* uctx) {
  int idx = 0;
  while (idx < PRT_FH_NSIG && k_signals[idx] != sig) idx++;
  if (atomic_exchange(&g_reported, 1) == 0) prt_fh_report(sig, prt_fh_fault_pc(uctx));
  if (idx == PRT_FH_NSIG) return;
  /* hand over: the previous handler becomes the handler again, and runs now if it is a function; otherwise the
     signal, blocked while this handler runs, is raised again and takes the default action when we return */
  struct sigaction prev = g_previous[idx];
  sigaction(sig, &prev, NULL);
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != NULL) prev.sa_sigaction(sig, info, uctx);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != NULL) {
    prev.sa_handler(sig);
  } else {
    raise(sig);
  }
}

/* Install the handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT (once). Returns 1 when installed now, 0 when
 * it already was, -1 on failure. */
PRT_FH_EXPORT int paddle_rt_fault_install(void) {
  if (atomic_exchange(&g_installed, 1)) return 0;
  void* prime[2];
  (void)backtrace(prime, 2); /* loads the unwinder now, not inside the handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = prt_fh_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < PRT_FH_NSIG; i++)
    if (sigaction(k_signals[i], &sa, &g_previous[i]) != 0) return -1;
  return 1;
}

PRT_FH_EXPORT int paddle_rt_fault_installed(void) { return atomic_load(&g_installed); }
