/* The smallest correct plugin: only the ten hooks the ABI requires (see tp_common.h for the switches and the
 * counters it exports). No streams, no callbacks, no asynchronous copies, no memory stats: paddle_rt must fall back
 * for all of those the way Paddle 3.3.1 does. */
#include "tp_common.h"

void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
}
