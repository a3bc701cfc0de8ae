/* Optional extensions of the custom-device plugin ABI that paddle_rt understands.
 *
 * A plugin may export any of these functions (C linkage, default visibility) next to InitPlugin. Paddle never looks
 * them up; paddle_rt does, with dlsym on the plugin's own handle, after the handshake. A plugin that exports none of
 * them gets paddle_rt's defaults, which are stated with each. */
#ifndef PADDLE_RT_EXTENSION_H_
#define PADDLE_RT_EXTENSION_H_

#include "paddle_rt/device_ext.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1 when the memory device_memory_allocate hands out is ordinary memory of this process that the host may
 * read and write at its address (a virtual or host-backed device), 0 otherwise. paddle_rt then exports device
 * allocations zero-copy (buffer protocol, __array_interface__, DLPack as CPU memory) and reads them at their address.
 * Default without it: 0, unless the device type is listed in PADDLE_RT_HOST_ADDRESSABLE. */
int paddle_rt_ext_host_addressable(void);
typedef int (*paddle_rt_ext_host_addressable_fn)(void);

/* Asked after an asynchronous collective on `comm` completed (its stream reached it): returns 1 when that collective
 * failed (a stream's completion cannot carry a status), 0 when it did not, -1 when `comm` is unknown. paddle_rt then
 * raises CollectiveError for it. Default without it: collectives that reported success at submission succeeded. */
int paddle_rt_ext_ccl_comm_error(C_CCLComm comm);
typedef int (*paddle_rt_ext_ccl_comm_error_fn)(C_CCLComm comm);

#ifdef __cplusplus
}
#endif

#endif /* PADDLE_RT_EXTENSION_H_ */
