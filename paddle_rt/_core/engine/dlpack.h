/* DLPack's tensor structs (the layout of dlpack.h v0.x, which every consumer reads), under our own names. */
#ifndef PADDLE_RT_ENGINE_DLPACK_H_
#define PADDLE_RT_ENGINE_DLPACK_H_

#include <stdint.h>
typedef struct { int32_t device_type; int32_t device_id; } prt_DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } prt_DLDataType;
typedef struct {
    void* data;
    prt_DLDevice device;
    int32_t ndim;
    prt_DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
} prt_DLTensor;
typedef struct prt_DLManagedTensor {
    prt_DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(struct prt_DLManagedTensor* self);
} prt_DLManagedTensor;

#endif /* PADDLE_RT_ENGINE_DLPACK_H_ */
