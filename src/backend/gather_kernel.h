/*
 * The gather kernel's interface, in one place: what backend/gather.c
 * launches, the mock driver emulates (tests/mockcuda/mockcuda_kernels.c)
 * and driver_probe runs on the real driver (driver_facts.txt).
 */
#ifndef CA_GATHER_KERNEL_H
#define CA_GATHER_KERNEL_H

#include <stdint.h>

/* The sets one launch takes, at most. */
#define CA_GATHER_MAX 64

/* One set, as the kernel reads it: 40 bytes. */
typedef struct ca_gather_set {
  uint64_t src, dst, pitch, copied;
  uint32_t width, rows;
} ca_gather_set;

/* The kernel's one parameter, passed by value: 2,568 bytes, within the
 * 4 KiB every device takes. */
typedef struct ca_gather_args {
  uint32_t expect, unused;
  ca_gather_set set[CA_GATHER_MAX];
} ca_gather_args;
_Static_assert(sizeof(ca_gather_args) == 2568,
               "the kernel's parameter, as the PTX declares it");

/* Block b of the grid takes set b: its threads compare its `rows` rows of
 * `width` bytes, `pitch` apart from `src` on, with `expect`, a byte each
 * in turn; when any differs (bar.red.or), they copy the rows to `dst`, one
 * after another, and thread 0 sets the byte at `copied` to 1. PTX ISA 6.0
 * for sm_52 on: the driver compiles it for the device at load (any driver
 * of CUDA 9.1 on). */
static const char ca_gather_ptx[] =
    ".version 6.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry ca_gather(.param .align 8 .b8 args[2568])\n"
    "{\n"
    "  .reg .pred %p<4>;\n"
    "  .reg .b16 %rs<3>;\n"
    "  .reg .b32 %r<10>;\n"
    "  .reg .b64 %rd<12>;\n"
    "  mov.b64 %rd1, args;\n"
    "  ld.param.u8 %rs1, [%rd1];\n" /* expect */
    "  mov.u32 %r1, %ctaid.x;\n"
    "  mul.wide.u32 %rd2, %r1, 40;\n"
    "  add.s64 %rd1, %rd1, %rd2;\n"
    "  ld.param.u64 %rd3, [%rd1+8];\n"  /* src */
    "  ld.param.u64 %rd4, [%rd1+16];\n" /* dst */
    "  ld.param.u64 %rd5, [%rd1+24];\n" /* pitch */
    "  ld.param.u64 %rd6, [%rd1+32];\n" /* copied */
    "  ld.param.v2.u32 {%r2, %r3}, [%rd1+40];\n" /* width, rows */
    "  cvt.u64.u32 %rd9, %r2;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mov.u32 %r5, %ntid.x;\n"
    "  mov.u32 %r8, 0;\n"
    "  mov.u64 %rd7, %rd3;\n"
    "  mov.u32 %r6, 0;\n"
    "SCAN_ROW:\n"
    "  setp.ge.u32 %p1, %r6, %r3;\n"
    "  @%p1 bra SCANNED;\n"
    "  mov.u32 %r7, %r4;\n"
    "SCAN_BYTE:\n"
    "  setp.ge.u32 %p1, %r7, %r2;\n"
    "  @%p1 bra SCAN_NEXT;\n"
    "  cvt.u64.u32 %rd8, %r7;\n"
    "  add.s64 %rd8, %rd7, %rd8;\n"
    "  ld.u8 %rs2, [%rd8];\n"
    "  setp.ne.s16 %p2, %rs2, %rs1;\n"
    "  selp.u32 %r9, 1, 0, %p2;\n"
    "  or.b32 %r8, %r8, %r9;\n"
    "  add.s32 %r7, %r7, %r5;\n"
    "  bra SCAN_BYTE;\n"
    "SCAN_NEXT:\n"
    "  add.s64 %rd7, %rd7, %rd5;\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  bra SCAN_ROW;\n"
    "SCANNED:\n"
    "  setp.ne.u32 %p1, %r8, 0;\n"
    "  bar.red.or.pred %p3, 0, %p1;\n"
    "  @!%p3 bra DONE;\n"
    "  mov.u32 %r6, 0;\n"
    "COPY_ROW:\n"
    "  setp.ge.u32 %p1, %r6, %r3;\n"
    "  @%p1 bra COPIED;\n"
    "  mov.u32 %r7, %r4;\n"
    "COPY_BYTE:\n"
    "  setp.ge.u32 %p1, %r7, %r2;\n"
    "  @%p1 bra COPY_NEXT;\n"
    "  cvt.u64.u32 %rd8, %r7;\n"
    "  add.s64 %rd10, %rd3, %rd8;\n"
    "  ld.u8 %rs2, [%rd10];\n"
    "  add.s64 %rd11, %rd4, %rd8;\n"
    "  st.u8 [%rd11], %rs2;\n"
    "  add.s32 %r7, %r7, %r5;\n"
    "  bra COPY_BYTE;\n"
    "COPY_NEXT:\n"
    "  add.s64 %rd3, %rd3, %rd5;\n"
    "  add.s64 %rd4, %rd4, %rd9;\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  bra COPY_ROW;\n"
    "COPIED:\n"
    "  setp.ne.u32 %p1, %r4, 0;\n"
    "  @%p1 bra DONE;\n"
    "  mov.u16 %rs2, 1;\n"
    "  st.u8 [%rd6], %rs2;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

#endif /* CA_GATHER_KERNEL_H */
