// How an op family's list (kernels/<family>_ops.def: each op declared once, with its contract) becomes the
// family's interface and each backend's class. Inside a class body:
//   #define PMAPCC_OP PMAPCC_OP_VIRTUAL        (the family's interface: kernels/<family>_ops.h)
//   #define PMAPCC_OP PMAPCC_OP_OVERRIDE       (a backend's class: kernels/cpu/ops.h, kernels/cuda/backend.h)
//   #include <pmapcc/kernels/conv_ops.def>     (which undefines PMAPCC_OP at its end)
// A new op is then one entry in its family's list and one definition per backend (LLVM's .def lists).
#pragma once

#define PMAPCC_OP_VIRTUAL(result, name, parameters) virtual result name parameters const = 0;
#define PMAPCC_OP_OVERRIDE(result, name, parameters) result name parameters const override;
