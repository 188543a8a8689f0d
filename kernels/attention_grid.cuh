// The grid order of the attention kernels (attention_wgmma.cu, attention_mma.cu): one CTA per
// query block and (batch, head).
#pragma once
#include "attention_params.h"
#include "gpu_compat.h"

// Which query block and (batch, head) a CTA takes. CTAs start roughly in index order, and
// consecutive CTAs should share K/V in L2: all query heads of one KV head (GQA group) run
// together, one group after another. Within a group, causal blocks go longest first (a block's
// work grows with its index), so short blocks, not long ones, end each group and the grid;
// without a mask, one head's blocks in index order.
static __device__ __forceinline__ void cta_block(const AttnParams& P, int nqb, int& qb, int& bh) {
  const int gs = P.hq / P.hkv;  // query heads per KV head
  const int grp = (int)(blockIdx.x / (nqb * gs)), rem = (int)(blockIdx.x % (nqb * gs));
  if (P.causal) {
    qb = nqb - 1 - rem / gs;
    bh = grp * gs + rem % gs;
  } else {
    qb = rem % nqb;
    bh = grp * gs + rem / nqb;
  }
}
