// Properties of the current CUDA device that launchers size their grids by, read once per process.
#pragma once

namespace lily::cuda {

int device_sm_count();  // multiprocessors (132 when the query fails)
int device_cc_major();  // compute capability major version (0 when the query fails)

}  // namespace lily::cuda
