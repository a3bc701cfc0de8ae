/* A plugin that misbehaves, for the conformance checker's tests (paddle_rt.tools.check). The minimal plugin's ten
 * required hooks (tp_common.h), with these faults:
 *   always      device_memory_allocate calls abort() for any request above ABORT_ABOVE bytes (default 1 MiB;
 *               -DABORT_ABOVE=0 turns this off)
 *   -DHANG      synchronize_event never returns
 *   -DCOPIES    adds memory_copy_h2d/d2h/d2d (plain memcpy: device memory is host memory here, but the device type
 *               is not host-addressable for paddle_rt unless listed in PADDLE_RT_HOST_ADDRESSABLE)
 *   -DSHORT_D2D with COPIES: memory_copy_d2d copies one byte less than asked (a wrong result, no crash)
 *   -DLAX_FREE  device_memory_deallocate reports C_SUCCESS for a pointer it does not know (a double free)
 *   -DHANG_FINALIZE  adds initialize (C_SUCCESS) and a finalize that never returns (the host hangs at exit)
 *   -DCALLBACK_TWICE  adds synchronous do-nothing streams (create/destroy/synchronize_stream) and a
 *               stream_add_callback that calls the callback twice, at once
 *   -DENTRY_FAULT  synchronize_event and device_memory_allocate are two assembly functions laid out back to back:
 *               synchronize_event returns C_SUCCESS (its last byte is a `ret`), and the first instruction of
 *               device_memory_allocate faults (x86-64: a store to address 0, SIGSEGV; aarch64: udf, SIGILL). The
 *               faulting pc minus one is inside synchronize_event. x86-64 and aarch64 only.
 * Switches of tp_common.h (DEVICE_TYPE...) apply too. */
#include <unistd.h>

#include "tp_common.h"

#ifndef ABORT_ABOVE
#define ABORT_ABOVE (1 << 20)
#endif

static C_Status crashy_device_memory_allocate(const C_Device device, void** ptr, size_t size) {
  if (ABORT_ABOVE > 0 && size > (size_t)ABORT_ABOVE) abort();
  return tp_device_memory_allocate(device, ptr, size);
}

#ifdef ENTRY_FAULT
/* With call frame information, so that the unwinder walks from the faulting frame to paddle_rt's caller. */
#if defined(__x86_64__)
#define CRASHY_RET "ret\n"
#define CRASHY_FAULT "movl $0, 0\n"
#elif defined(__aarch64__)
#define CRASHY_RET "ret\n"
#define CRASHY_FAULT "udf #0\n"
#else
#error "ENTRY_FAULT: x86-64 and aarch64 only"
#endif
/* Hidden, as the static hooks of the other builds: in .symtab only, so a stripped copy has no symbol for them. */
__attribute__((visibility("hidden"))) C_Status crashy_entry_synchronize_event(const C_Device device, C_Event event);
__attribute__((visibility("hidden"))) C_Status crashy_entry_device_memory_allocate(const C_Device device, void** ptr,
                                                                                   size_t size);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl crashy_entry_synchronize_event\n"
        ".hidden crashy_entry_synchronize_event\n"
        ".type crashy_entry_synchronize_event, @function\n"
        "crashy_entry_synchronize_event:\n"
        ".cfi_startproc\n"
#if defined(__x86_64__)
        "xorl %eax, %eax\n"
#else
        "mov w0, #0\n"
#endif
        CRASHY_RET
        ".cfi_endproc\n"
        ".size crashy_entry_synchronize_event, .-crashy_entry_synchronize_event\n"
        ".globl crashy_entry_device_memory_allocate\n"
        ".hidden crashy_entry_device_memory_allocate\n"
        ".type crashy_entry_device_memory_allocate, @function\n"
        "crashy_entry_device_memory_allocate:\n"
        ".cfi_startproc\n"
        CRASHY_FAULT
        CRASHY_RET
        ".cfi_endproc\n"
        ".size crashy_entry_device_memory_allocate, .-crashy_entry_device_memory_allocate\n");
#endif

#ifdef HANG
static C_Status crashy_synchronize_event(const C_Device device, C_Event event) {
  (void)device;
  (void)event;
  for (;;) pause(); /* never returns */
  return C_SUCCESS;
}
#endif

#ifdef LAX_FREE
static C_Status crashy_device_memory_deallocate(const C_Device device, void* ptr, size_t size) {
  (void)tp_device_memory_deallocate(device, ptr, size);
  return C_SUCCESS; /* whatever happened */
}
#endif

#ifdef COPIES
static C_Status crashy_copy(const C_Device device, void* dst, const void* src, size_t size) {
  if (!tp_valid_device(device) || (size && (dst == NULL || src == NULL))) return C_ERROR;
  if (size) memmove(dst, src, size);
  return C_SUCCESS;
}

static C_Status crashy_copy_d2d(const C_Device device, void* dst, const void* src, size_t size) {
#ifdef SHORT_D2D
  if (size) size -= 1;
#endif
  return crashy_copy(device, dst, src, size);
}
#endif

#ifdef HANG_FINALIZE
static C_Status crashy_initialize(void) { return C_SUCCESS; }

static C_Status crashy_finalize(void) {
  for (;;) pause(); /* never returns */
  return C_SUCCESS;
}
#endif

#ifdef CALLBACK_TWICE
static C_Status crashy_create_stream(const C_Device device, C_Stream* stream) {
  if (!tp_valid_device(device) || stream == NULL) return C_ERROR;
  *stream = (C_Stream)(uintptr_t)0x5000;
  return C_SUCCESS;
}

static C_Status crashy_stream_noop(const C_Device device, C_Stream stream) {
  (void)stream;
  return tp_valid_device(device) ? C_SUCCESS : C_ERROR;
}

static C_Status crashy_add_callback(const C_Device device, C_Stream stream, C_Callback callback, void* user_data) {
  if (!tp_valid_device(device) || callback == NULL) return C_ERROR;
  C_Status st = C_SUCCESS;
  callback(device, stream, user_data, &st);
  callback(device, stream, user_data, &st); /* the bug */
  return C_SUCCESS;
}
#endif

void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
  params->interface->device_memory_allocate = crashy_device_memory_allocate;
#ifdef ENTRY_FAULT
  params->interface->synchronize_event = crashy_entry_synchronize_event;
  params->interface->device_memory_allocate = crashy_entry_device_memory_allocate;
#endif
#ifdef HANG
  params->interface->synchronize_event = crashy_synchronize_event;
#endif
#ifdef LAX_FREE
  params->interface->device_memory_deallocate = crashy_device_memory_deallocate;
#endif
#ifdef HANG_FINALIZE
  params->interface->initialize = crashy_initialize;
  params->interface->finalize = crashy_finalize;
#endif
#ifdef CALLBACK_TWICE
  params->interface->create_stream = crashy_create_stream;
  params->interface->destroy_stream = crashy_stream_noop;
  params->interface->synchronize_stream = crashy_stream_noop;
  params->interface->stream_add_callback = crashy_add_callback;
#endif
#ifdef COPIES
  params->interface->memory_copy_h2d = crashy_copy;
  params->interface->memory_copy_d2h = crashy_copy;
  params->interface->memory_copy_d2d = crashy_copy_d2d;
#endif
}
