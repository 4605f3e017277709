// Every element type the project names, listed once (as c10's ScalarType.h
// lists torch's with AT_FORALL_SCALAR_TYPES): each layer makes its own table
// from this list (collectives' DataType, the executor's element sizes, the
// compiler IR's dtype names, the torch-facing conversions, the checkpoint
// format's names, the Python package's through torchneuron._C.dtypes()), so
// no two of them can disagree.
//
//   X(Id, bytes, floating, name, ir, Torch, Device)
//     Id        the enumerator's stem: collectives::DataType::k##Id
//     bytes     the size of one element (bool: one byte, 0 or 1)
//     floating  true for floating point
//     name      torch's name without "torch." ("bfloat16"): messages,
//               checkpoints, the Python binding
//     ir        the compiler IR's dtype ("bf16")
//     Torch     c10::ScalarType's stem: at::k##Torch
//     Device    the executable format's runtime::proto::ElementType, or
//               ELEMENT_TYPE_UNSPECIFIED where the device does not compute
//               in it (float64)
//
// The order is part of collectives' wire format (DataType travels as its
// index in a header): append, never reorder.
//
// Usage:
//   #define NAME_OF(Id, bytes, floating, name, ir, Torch, Device) case DataType::k##Id: return name;
//   switch (type) { NEURON_FORALL_DTYPES(NAME_OF) }
//   #undef NAME_OF
#pragma once

#define NEURON_FORALL_DTYPES(X)                                        \
  X(Float32, 4, true, "float32", "f32", Float, F32)                    \
  X(Float64, 8, true, "float64", "f64", Double, ELEMENT_TYPE_UNSPECIFIED) \
  X(Float16, 2, true, "float16", "f16", Half, F16)                     \
  X(BFloat16, 2, true, "bfloat16", "bf16", BFloat16, BF16)             \
  X(Int8, 1, false, "int8", "i8", Char, I8)                            \
  X(UInt8, 1, false, "uint8", "u8", Byte, U8)                          \
  X(Int32, 4, false, "int32", "i32", Int, I32)                         \
  X(Int64, 8, false, "int64", "i64", Long, I64)                        \
  X(Bool, 1, false, "bool", "bool", Bool, BOOL)
