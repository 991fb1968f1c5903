#!/usr/bin/env python3
"""Brute-force bank-conflict check of the shared-memory layout of the paged
decode kernel version 6 (kernels/cuda/paged_decode_mma_v6.cuh, v6_slot):
chunk c of tile key k sits at 16-byte slot 16 c + (k ^ h(c)). Checks every
access phase of the kernel at every row width it has (2, 4, 8, 16 chunks of
16 bytes: q4_0 hd 64 .. f16 hd 128): the cp.async writes (lane l takes
chunk l % CR of key l / CR, 8 lanes a phase), the K ldmatrix phases (8 keys,
one chunk) and the V reads (keys 2t + c of lanes t, a block's 2-8 bytes at
g x share of lanes g; 8-byte reads in two half-warp phases). Prints the
worst conflict degree per (access, row chunks); 1 = conflict-free. The
(vq8, 2) and (vf16, 4) rows are head_dim 32, which version 6 does not take.
"""
def h(c, CR):
    if CR >= 8: return c & 7
    if CR == 4: return (2*c) ^ (c & 1)
    if CR == 2: return 4*c
    raise
def addr(k, c, CR): return (c*16 + (k ^ h(c, CR)))*16
def conflicts(phase):  # list of (byte addr, size)
    banks = {}
    for a, s in phase:
        for w in range(a//4, (a+s+3)//4):
            banks.setdefault(w % 32, set()).add(w)
    return max(len(v) for v in banks.values())
worst = {}
for CR in (2, 4, 8, 16):
    # writes
    for it in range(16*CR//32):
        for ph in range(4):
            p = []
            for l in range(8*ph, 8*ph+8):
                i = l + 32*it; k, c = i // CR, i % CR
                p.append((addr(k, c, CR), 16))
            worst[('w', CR)] = max(worst.get(('w', CR), 1), conflicts(p))
    # K ldmatrix
    for j in range(2):
        for c in range(CR):
            p = [(addr(k + 8*j, c, CR), 16) for k in range(8)]
            worst[('k', CR)] = max(worst.get(('k', CR), 1), conflicts(p))
    # V reads
    for typ, bb in (('q8', 32), ('q4', 16), ('f16', 64)):
        nb = CR*16 // bb
        if nb < 1: continue
        for j in range(2):
            for c0 in range(2):
                for b in range(nb):
                    lanes = []
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        k = 2*t + c0 + 8*j
                        if typ == 'q8': byte, sz = 4*g, 4
                        elif typ == 'q4': byte, sz = 2*g, 2
                        else: byte, sz = 8*g, 8
                        ch = (b*bb + byte)//16; off = (b*bb + byte) % 16
                        lanes.append((addr(k, ch, CR) + off, sz))
                    phases = [lanes] if typ != 'f16' else [lanes[:16], lanes[16:]]
                    for p in phases:
                        worst[('v'+typ, CR)] = max(worst.get(('v'+typ, CR), 1), conflicts(p))
for k, v in sorted(worst.items(), key=str): print(k, v)
