#!/usr/bin/env python3
"""Index math of paged decode version 11 (kernels/cuda/paged_decode_mma_v11.cuh),
emulated: TMA's 128-byte swizzle (16-byte chunk c of row r of a 1024-aligned
box at chunk c ^ (r & 7)), the lanes' shared-memory reads, their bank
conflicts, and that the K / q / V fragment orders give the right dot
products. Run: python3 tools/check_v11_swizzle.py (prints OK or fails)."""
import random


def swz(r, b):  # byte offset of logical (row r, byte b) in a stage's 16 x 128 quants
    return r * 128 + (((b // 16) ^ (r % 8)) * 16) + b % 16


def wavefronts(addrs, width):
    """Shared-memory wavefronts of one instruction: 128-bit loads go by
    quarter warp (8 lanes), narrower ones by the whole warp; within a group,
    distinct 4-byte words in the same bank conflict."""
    group = 8 if width == 16 else 32
    worst = 1
    for q in range(0, 32, group):
        banks = {}
        for a in addrs[q:q + group]:
            for w in range(a // 4, (a + width - 1) // 4 + 1):
                banks.setdefault(w % 32, set()).add(w)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


def main():
    rng = random.Random(1)
    lanes = [(l // 4, l % 4) for l in range(32)]
    # Logical tile: K and V quants [16 keys][128 dims], stored swizzled.
    kq = [[rng.randrange(256) for _ in range(128)] for _ in range(16)]
    vq = [[rng.randrange(256) for _ in range(128)] for _ in range(16)]
    ks_mem = bytearray(16 * 128)
    vs_mem = bytearray(16 * 128)
    for r in range(16):
        for b in range(128):
            ks_mem[swz(r, b)] = kq[r][b]
            vs_mem[swz(r, b)] = vq[r][b]
    # K: lane (g, t), group j, reads chunk positions (2t + i) ^ g of row 8j + g.
    for j in range(2):
        for i in range(2):
            addrs = []
            for g, t in lanes:
                row = 8 * j + g
                a = row * 128 + 16 * ((2 * t + i) ^ g)
                addrs.append(a)
                got = list(ks_mem[a:a + 16])
                assert got == kq[row][32 * t + 16 * i:32 * t + 16 * i + 16], ("K bytes", j, i, g, t)
            assert wavefronts(addrs, 16) == 1, ("K conflicts", j, i)
    # QK: k-step w, k position 2t + h (a0 / b0) and 2t + 8 + h (a2 / b1):
    # q element 32t + 4w + 2r + h against K byte 4w + 2r + h of the lane's 32.
    q = [rng.uniform(-1, 1) for _ in range(128)]
    for key in range(16):
        g = key % 8
        acc = 0.0
        for w in range(8):
            for t in range(4):
                kb = kq[key][32 * t:32 * t + 32]
                for r in range(2):
                    for h in range(2):
                        acc += q[32 * t + 4 * w + 2 * r + h] * kb[4 * w + 2 * r + h]
        want = sum(q[d] * kq[key][d] for d in range(128))
        assert abs(acc - want) < 1e-9, ("QK", key)
    # K scales: lane (g, t) reads u16 at row 8j + g, byte 2t of 16-byte rows.
    for j in range(2):
        addrs = [(8 * j + g) * 16 + 2 * t for g, t in lanes]
        assert wavefronts(addrs, 2) == 1, "K scale conflicts"
    # V: lane g reads chunk g of row 8j + 2t + c at position g ^ (2t + c).
    for j in range(2):
        for c in range(2):
            addrs = []
            for g, t in lanes:
                row = 8 * j + 2 * t + c
                a = row * 128 + 16 * (g ^ (row & 7))
                addrs.append(a)
                assert list(vs_mem[a:a + 16]) == vq[row][16 * g:16 * g + 16], ("V bytes", j, c, g, t)
            assert wavefronts(addrs, 16) == 1, ("V conflicts", j, c)
            saddrs = [(8 * j + 2 * t + c) * 16 + 2 * (g // 2) for g, t in lanes]
            assert wavefronts(saddrs, 2) == 1, "V scale conflicts"
            # Block of lane g's 16 values: g // 2 (version 7's v_block at hd 128).
            assert all((16 * g) // 32 == g // 2 for g in range(8))
    print("OK: version 11 swizzle, fragment orders and bank math")


if __name__ == "__main__":
    main()
