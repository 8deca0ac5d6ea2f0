// Shipped with hatch-khal, found before CCCL's file of the same name (khal.h's folder comes
// first on the include path): it makes <thrust/complex.h> usable under NVRTC.
//
// CCCL's thrust/detail/complex/stream.h defines operator<< / operator>> of thrust::complex
// for std::basic_ostream / std::basic_istream, and <thrust/complex.h> includes it without the
// _CCCL_HOSTED() guard its other host-only parts have. NVRTC has no host standard library
// (CCCL treats it as freestanding), so that file fails with 'namespace "std" has no member
// "basic_ostream"' (measured with nvidia-cuda-cccl 13.3). Stream operators cannot exist in
// device code anyway: under NVRTC this file is empty, and everything else of
// <thrust/complex.h> (the type, its arithmetic and math functions) is CCCL's own.
#pragma once
