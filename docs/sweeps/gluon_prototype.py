"""Prototype of the Gluon attention kernels (2-D descriptors, lengths a multiple of the blocks):
attn_fwd, one program of 1 or 2 warp groups with the softmax under its own p @ v; attn_fwd_ws, the
warp-specialized schedule that became kernels/attention.py's "ws" loads."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    tma, mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, offs_m, kn, MASK: gl.constexpr):
    if MASK:
        s = gl.where(offs_m[:, None] >= kn[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def attn_fwd(q_desc, k_desc, v_desc, o_desc, qk_scale, H, GROUP, SEQ,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
             NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
             num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)       # heaviest query blocks first
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    kv_row = (b * (H // GROUP) + h // GROUP) * SEQ           # rows of k, v viewed [B*Hkv*S, D]
    q_row = bh * SEQ + pid_m * BLOCK_M

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(kv_bar.index(i), count=1)

    if CAUSAL:
        n_total = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N
        n_full = (pid_m * BLOCK_M + 1) // BLOCK_N            # blocks every row of the tile sees whole
    else:
        n_total = SEQ // BLOCK_N
        n_full = n_total

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    kv_bytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    for i in gl.static_range(NUM_BUF):
        go = i < n_total
        mbarrier.expect(kv_bar.index(i), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [kv_row + i * BLOCK_N, 0], kv_bar.index(i), k_smem.index(i), pred=go)
        tma.async_copy_global_to_shared(v_desc, [kv_row + i * BLOCK_N, 0], kv_bar.index(i), v_smem.index(i), pred=go)

    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)

    # block 0's scores and softmax
    mbarrier.wait(kv_bar.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    if n_full > 0:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, offs_n, False)
    else:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, offs_n, True)

    for j in range(1, n_total):
        st = j % NUM_BUF
        prev = (j - 1) % NUM_BUF
        mbarrier.wait(kv_bar.index(st), (j // NUM_BUF) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        pd = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(pd, v_smem.index(prev), acc, is_async=True)
        if OVERLAP:
            s = warpgroup_mma_wait(1, deps=(s_tok, ))       # the scores; p @ v still running
        else:
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
        if j >= n_full:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, True)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, False)
        acc, pd = warpgroup_mma_wait(0, deps=(acc_tok, pd))
        # slot prev is free: block j - 1 + NUM_BUF into it
        nxt = j - 1 + NUM_BUF
        go = nxt < n_total
        mbarrier.expect(kv_bar.index(prev), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [kv_row + nxt * BLOCK_N, 0], kv_bar.index(prev), k_smem.index(prev), pred=go)
        tma.async_copy_global_to_shared(v_desc, [kv_row + nxt * BLOCK_N, 0], kv_bar.index(prev), v_smem.index(prev), pred=go)

    last = (n_total - 1) % NUM_BUF
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    pd = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(pd, v_smem.index(last), acc)
    o = acc / gl.convert_layout(l_i, row_o)[:, None]

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_BUF):
        mbarrier.invalidate(kv_bar.index(i))
    q_smem.store(o.to(dtype))                                # q's tile is done with: o goes out through it
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


def attention(q, k, v, causal, scale=None, block_m=128, block_n=128, num_warps=8, num_buf=2, overlap=True):
    """q [B, H, S, D], k, v [B, Hkv, S, D], contiguous bf16/fp16, S a multiple of the blocks."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, H, S, D = q.shape
    Hkv = k.shape[1]
    assert S % block_m == 0 and S % block_n == 0 and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    o = torch.empty_like(q)
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    lq = gl.NVMMASharedLayout.get_default_for([block_m, D], gdt)
    lk = gl.NVMMASharedLayout.get_default_for([block_n, D], gdt)
    q2, k2, v2, o2 = (t.view(-1, D) for t in (q, k, v, o))
    dq = TensorDescriptor.from_tensor(q2, [block_m, D], lq)
    dk = TensorDescriptor.from_tensor(k2, [block_n, D], lk)
    dv = TensorDescriptor.from_tensor(v2, [block_n, D], lk)
    do = TensorDescriptor.from_tensor(o2, [block_m, D], lq)
    scale = 1.0 / D ** 0.5 if scale is None else scale
    grid = (S // block_m, B * H)
    attn_fwd[grid](dq, dk, dv, do, scale * 1.4426950408889634, H, H // Hkv, S,
                   BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=D, NUM_BUF=num_buf, CAUSAL=bool(causal),
                   OVERLAP=overlap, num_warps=num_warps)
    return o


# ---- warp-specialized: a loader warp, two consumer warp groups taking turns on the tensor cores
@gluon.jit
def _ws_loader(descs, bufs, bars, scal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem = bufs
    q_bar, kv_ready, kv_empty, turn = bars
    qk_scale, H, GROUP, SEQ = scal
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    kv_row = (b * (H // GROUP) + h // GROUP) * SEQ
    q_row = bh * SEQ + pid_m * BLOCK_M
    HALF: gl.constexpr = BLOCK_M // 2
    if CAUSAL:
        n_total = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N
    else:
        n_total = SEQ // BLOCK_N
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, 0], q_bar, q_smem.index(1))
    kv_bytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    for j in range(n_total):
        st = j % NUM_BUF
        mbarrier.wait(kv_empty.index(st), ((j // NUM_BUF) & 1) ^ 1)
        mbarrier.expect(kv_ready.index(st), kv_bytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], kv_ready.index(st), k_smem.index(st))
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], kv_ready.index(st), v_smem.index(st))


@gluon.jit
def _ws_consumer(descs, bufs, bars, scal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr, C: gl.constexpr):
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem = bufs
    q_bar, kv_ready, kv_empty, turn = bars
    qk_scale, H, GROUP, SEQ = scal
    dtype: gl.constexpr = q_desc.dtype
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    HALF: gl.constexpr = BLOCK_M // 2
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    row0 = pid_m * BLOCK_M + C * HALF                        # this warp group's first query row
    if CAUSAL:
        n_total = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N
        n_full = (row0 + 1) // BLOCK_N
    else:
        n_total = SEQ // BLOCK_N
        n_full = n_total

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_s = q_smem.index(C)
    my_turn = turn.index(C)
    other = turn.index(1 - C)
    if C == 1:
        mbarrier.arrive(other, count=1)                      # warp group 0 goes first

    offs_m = row0 + gl.arange(0, HALF, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([HALF], gl.float32, layout=row_s)
    acc = gl.zeros([HALF, HEAD_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)

    # block 0: its scores alone
    mbarrier.wait(kv_ready.index(0), 0)
    mbarrier.wait(my_turn, 0)
    s_tok = warpgroup_mma(q_s, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.arrive(other, count=1)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    if n_full > 0:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, offs_n, False)
    else:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, offs_n, True)

    for j in range(1, n_total):
        st = j % NUM_BUF
        prev = (j - 1) % NUM_BUF
        mbarrier.wait(kv_ready.index(st), (j // NUM_BUF) & 1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        pd = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(my_turn, j & 1)
        s_tok = warpgroup_mma(q_s, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(pd, v_smem.index(prev), acc, is_async=True)
        mbarrier.arrive(other, count=1)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        if j >= n_full:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, True)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, False)
        acc, pd = warpgroup_mma_wait(0, deps=(acc_tok, pd))
        mbarrier.arrive(kv_empty.index(prev), count=1)

    last = (n_total - 1) % NUM_BUF
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    pd = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(my_turn, n_total & 1)
    acc_tok = warpgroup_mma(pd, v_smem.index(last), acc, is_async=True)
    mbarrier.arrive(other, count=1)
    acc, pd = warpgroup_mma_wait(0, deps=(acc_tok, pd))
    mbarrier.arrive(kv_empty.index(last), count=1)
    o = acc / gl.convert_layout(l_i, row_o)[:, None]
    q_s.store(o.to(dtype))                                   # this group's q tile carries o out
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [bh * SEQ + row0, 0], q_s)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_consumer1(descs, bufs, bars, scal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    _ws_consumer(descs, bufs, bars, scal, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL, 1)


@gluon.jit
def attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, qk_scale, H, GROUP, SEQ,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
                CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    HALF: gl.constexpr = BLOCK_M // 2
    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)            # both consumer groups release a slot
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    descs = (q_desc, k_desc, v_desc, o_desc)
    bufs = (q_smem, k_smem, v_smem)
    bars = (q_bar, kv_ready, kv_empty, turn)
    scal = (qk_scale, H, GROUP, SEQ)
    gl.warp_specialize([
        (_ws_consumer, (descs, bufs, bars, scal, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL, 0)),
        (_ws_consumer1, (descs, bufs, bars, scal, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL)),
        (_ws_loader, (descs, bufs, bars, scal, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL)),
    ], [4, 1], [CONSUMER_REGS, 24])


def attention_ws(q, k, v, causal, scale=None, block_m=128, block_n=128, num_buf=2, regs=240, maxnreg=168):
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, H, S, D = q.shape
    Hkv = k.shape[1]
    assert S % block_m == 0 and S % block_n == 0 and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    o = torch.empty_like(q)
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    lq = gl.NVMMASharedLayout.get_default_for([block_m // 2, D], gdt)
    lk = gl.NVMMASharedLayout.get_default_for([block_n, D], gdt)
    q2, k2, v2, o2 = (t.view(-1, D) for t in (q, k, v, o))
    dq = TensorDescriptor.from_tensor(q2, [block_m // 2, D], lq)
    dk = TensorDescriptor.from_tensor(k2, [block_n, D], lk)
    dv = TensorDescriptor.from_tensor(v2, [block_n, D], lk)
    do = TensorDescriptor.from_tensor(o2, [block_m // 2, D], lq)
    scale = 1.0 / D ** 0.5 if scale is None else scale
    grid = (S // block_m, B * H)
    attn_fwd_ws[grid](dq, dk, dv, do, scale * 1.4426950408889634, H, H // Hkv, S,
                      BLOCK_M=block_m, BLOCK_N=block_n, NUM_BUF=num_buf, CAUSAL=bool(causal),
                      CONSUMER_REGS=regs, num_warps=4, maxnreg=maxnreg)
    return o
