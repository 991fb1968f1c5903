# Python model of the fused GEMM's index math (gemm_q_mma_sm80.cuh,
# gemm_q_wgmma_sm90.cuh) (no GPU needed): one CTA, one
# k-tile, the kernel's cp.async offsets, swizzles, k permutation, decode
# and mma fragment layout (PTX m16n8k16) against a direct sum, for Q4_0 and
# Q8_0 at BN 16 and 64 with masked rows and tokens; then the shared-memory
# wavefronts of the A (4-byte) and B (8-byte) loads. Keep in sync with the
# kernel by hand when its layout changes. Run: python3 tools/gemm_q_mma_model.py
import random, struct
def f16(v): return struct.unpack('<e', struct.pack('<e', v))[0]
def f16bits(v): return struct.unpack('<H', struct.pack('<e', v))[0]
def bits2f(u): return struct.unpack('<e', struct.pack('<H', u & 0xFFFF))[0]
def byte_perm(x, y, s):
    b = [(x >> (8*i)) & 0xFF for i in range(4)] + [(y >> (8*i)) & 0xFF for i in range(4)]
    return sum(b[(s >> (4*i)) & 7] << (8*i) for i in range(4))
def level_pair(x, bias, d):
    x |= 0x64006400
    lo = f16(f16(bits2f(x) - bias) * d); hi = f16(f16(bits2f(x >> 16) - bias) * d)
    return (lo, hi)
BM, BK = 128, 128
def run(kT, BN, rows, n, cols=BK):
    kWarpsN = 2 if BN >= 64 else 1; kWarpsM = 8 // kWarpsN; kMT = BM // (16*kWarpsM); kWN = BN // kWarpsN; kNT = kWN // 8
    rng = random.Random(1)
    lv = [[rng.randrange(-8, 8) if kT == 'q4' else rng.randrange(-128, 128) for c in range(cols)] for r in range(rows)]
    sc = [[f16(rng.uniform(0.01, 0.1)) for b in range(cols//32)] for r in range(rows)]
    x = [[f16(rng.gauss(0, 1)) for c in range(cols)] for t in range(n)]
    # global layout
    if kT == 'q4':
        qrow = cols // 2
        q = bytearray(rows * qrow)
        for r in range(rows):
            for b in range(cols // 32):
                for j in range(16):
                    q[r*qrow + 16*b + j] = (lv[r][32*b+j] + 8) | ((lv[r][32*b+j+16] + 8) << 4)
    else:
        qrow = cols
        q = bytearray(rows * qrow)
        for r in range(rows):
            for c in range(cols): q[r*qrow + c] = lv[r][c] & 0xFF
    dbytes = b''.join(struct.pack('<e', sc[r][b]) for r in range(rows) for b in range(cols//32))
    xbytes = b''.join(struct.pack('<e', x[t][c]) for t in range(n) for c in range(cols))
    RB = 64 if kT == 'q4' else 128; chunk_cols = 32 if kT == 'q4' else 16
    QB = BM*RB; SB = BM*4*2; XB = BN*BK*2
    sm = bytearray(b'\xAA' * (QB+SB+XB)); written = set()
    def cp(dst, src_buf, src, nb, ok):
        for i in range(nb):
            assert dst+i not in written, "double write"; written.add(dst+i)
            sm[dst+i] = src_buf[src+i] if ok else 0
    def qswz(r, c): return r*64 + ((c ^ ((r >> 1) & 3)) << 4) if kT == 'q4' else r*128 + ((c ^ (r & 7)) << 4)
    def xswz(j, c): return j*BK*2 + ((c ^ ((j & 3) << 1)) << 4)
    k0 = 0; m0 = 0; n0 = 0
    for tid in range(256):
        for it in range(BM*(RB//16)//256):
            i = tid + it*256; r, c = divmod(i, RB//16)
            row, col = m0 + r, k0 + c*chunk_cols; ok = row < rows and col < cols
            cp(qswz(r, c), q, row*qrow + col*RB//BK if ok else 0, 16, ok)
        r, p = tid >> 1, tid & 1; row, col = m0 + r, k0 + 64*p; ok = row < rows and col < cols
        cp(QB + r*8 + p*4, dbytes, (row*(cols//32) + col//32)*2 if ok else 0, 4, ok)
        for it in range(BN*(BK//8)//256):
            i = tid + it*256; j, c = divmod(i, BK//8); tok, col = n0 + j, k0 + 8*c; ok = tok < n and col < cols
            cp(QB + SB + xswz(j, c), xbytes, (tok*cols + col)*2 if ok else 0, 16, ok)
    assert len(written) == len(sm), (len(written), len(sm))
    lds32 = lambda a: struct.unpack_from('<I', sm, a)[0]
    acc = {}
    for warp in range(8):
        wm, wn = warp % kWarpsM, warp // kWarpsM
        A = {}; B = {}
        for blk in range(4):
            fr = {}  # lane -> [mt][s][4], b [s][nt]
            for lane in range(32):
                g, t = lane >> 2, lane & 3; arow = wm*kMT*16 + g; xtok = wn*kWN + g
                xkey = (g & 3) << 1; qkey = ((g >> 1) & 3) if kT == 'q4' else g
                af = [[None]*2 for _ in range(kMT)]
                for mt in range(kMT):
                    r = arow + mt*16
                    sa = struct.unpack_from('<II', sm, QB + r*8); sb = struct.unpack_from('<II', sm, QB + (r+8)*8)
                    wsel = 0x3232 if blk & 1 else 0x1010
                    da = bits2f(byte_perm(sa[0] if blk < 2 else sa[1], 0, wsel)); db = bits2f(byte_perm(sb[0] if blk < 2 else sb[1], 0, wsel))
                    if kT == 'q4':
                        off = ((blk ^ qkey) << 4) + 4*t
                        def dec(w, d):
                            x01, x23 = byte_perm(w, 0, 0x4140), byte_perm(w, 0, 0x4342)
                            return [[level_pair(x01 & 0xF000F, 1032, d), level_pair(x23 & 0xF000F, 1032, d)],
                                    [level_pair((x01 >> 4) & 0xF000F, 1032, d), level_pair((x23 >> 4) & 0xF000F, 1032, d)]]
                        pa, pb = dec(lds32(r*64 + off), da), dec(lds32((r+8)*64 + off), db)
                        for s in range(2): af[mt][s] = [pa[s][0], pb[s][0], pa[s][1], pb[s][1]]
                    else:
                        for s in range(2):
                            off = (((2*blk + s) ^ qkey) << 4) + 4*t
                            dec = lambda w, d: [level_pair(byte_perm(w, 0, 0x4140) ^ 0x800080, 1152, d), level_pair(byte_perm(w, 0, 0x4342) ^ 0x800080, 1152, d)]
                            pa, pb = dec(lds32(r*128 + off), da), dec(lds32((r+8)*128 + off), db)
                            af[mt][s] = [pa[0], pb[0], pa[1], pb[1]]
                bf = [[None]*kNT for _ in range(2)]
                for s in range(2):
                    xoff = (((4*blk + 2*s) ^ xkey) << 4) + (t >> 1)*16 + (t & 1)*8
                    for nt in range(kNT):
                        a = QB + SB + (xtok + nt*8)*BK*2 + xoff
                        b0 = (bits2f(struct.unpack_from('<H', sm, a)[0]), bits2f(struct.unpack_from('<H', sm, a+2)[0]))
                        b1 = (bits2f(struct.unpack_from('<H', sm, a+4)[0]), bits2f(struct.unpack_from('<H', sm, a+6)[0]))
                        bf[s][nt] = (b0, b1)
                fr[lane] = (af, bf)
            # mma per (s, mt, nt) with PTX fragment semantics
            for s in range(2):
                for mt in range(kMT):
                    for nt in range(kNT):
                        Am = [[0]*16 for _ in range(16)]; Bm = [[0]*8 for _ in range(16)]
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3; a = fr[lane][0][mt][s]; b = fr[lane][1][s][nt]
                            for j in range(2):
                                Am[g][2*t+j] = a[0][j]; Am[g+8][2*t+j] = a[1][j]; Am[g][2*t+8+j] = a[2][j]; Am[g+8][2*t+8+j] = a[3][j]
                                Bm[2*t+j][g] = b[0][j]; Bm[2*t+8+j][g] = b[1][j]
                        for i in range(16):
                            for jj in range(8):
                                row = m0 + wm*kMT*16 + mt*16 + i; tok = n0 + wn*kWN + nt*8 + jj
                                acc[(row, tok)] = acc.get((row, tok), 0.0) + sum(Am[i][k]*Bm[k][jj] for k in range(16))
    err = 0
    for r in range(rows):
        for t in range(n):
            ref = sum(f16(lv[r][c]*sc[r][c//32]) * x[t][c] for c in range(cols))
            err = max(err, abs(acc[(r, t)] - ref))
    print(kT, BN, rows, n, 'max abs err', err)
    assert err < 1e-9
for kT in ('q4', 'q8'):
    for BN, n in ((16, 13), (64, 50)):
        run(kT, BN, 100, n)

def wavefronts(addrs, width):
    banks = {}
    for a in addrs:
        for w in range(0, width, 4):
            banks.setdefault(((a + w) // 4) % 32, set()).add((a + w) // 4)
    return max(len(v) for v in banks.values())
for kT in ('q4', 'q8'):
    worst = 0
    for blk in range(4):
        for s in range(2):
            for half in (0, 8):
                addrs = []
                for lane in range(32):
                    g, t = lane >> 2, lane & 3; r = g + half + 16
                    if kT == 'q4': addrs.append(r*64 + ((blk ^ ((g >> 1) & 3)) << 4) + 4*t)
                    else: addrs.append(r*128 + (((2*blk + s) ^ g) << 4) + 4*t)
                worst = max(worst, wavefronts(addrs, 4))
    print(kT, 'A lds32 wavefronts', worst)
worst = 0
for blk in range(4):
    for s in range(2):
        for nt in range(4):
            for hw in (range(16), range(16, 32)):  # 64-bit loads: per half-warp
                addrs = []
                for lane in hw:
                    g, t = lane >> 2, lane & 3; j = g + nt*8
                    addrs.append(j*256 + ((((4*blk + 2*s) ^ ((g & 3) << 1))) << 4) + (t >> 1)*16 + (t & 1)*8)
                worst = max(worst, wavefronts(addrs, 8))
print('B lds64 wavefronts per half-warp', worst)

# Version 2 (wgmma): A fragments in the natural k order from the same quant
# tile (two 4-byte loads + byte_perm per row per chunk), x in the 128-byte
# swizzle a K-major wgmma descriptor reads; check both against the values.
def run_v2(kT, BN, rows, n, cols=BK):
    rng = random.Random(2)
    lv = [[rng.randrange(-8, 8) if kT == 'q4' else rng.randrange(-128, 128) for c in range(cols)] for r in range(rows)]
    sc = [[f16(rng.uniform(0.01, 0.1)) for b in range(cols//32)] for r in range(rows)]
    RB = 64 if kT == 'q4' else 128
    sq = bytearray(BM*RB); ss = bytearray(BM*8)
    def qswz(r, c): return r*64 + ((c ^ ((r >> 1) & 3)) << 4) if kT == 'q4' else r*128 + ((c ^ (r & 7)) << 4)
    for r in range(min(rows, BM)):
        for b in range(cols // 32):
            struct.pack_into('<e', ss, r*8 + 2*b, sc[r][b])
            if kT == 'q4':
                for j in range(16):
                    sq[qswz(r, b) + j] = (lv[r][32*b+j] + 8) | ((lv[r][32*b+j+16] + 8) << 4)
            else:
                for j in range(32):
                    sq[qswz(r, 2*b + j // 16) + j % 16] = lv[r][32*b+j] & 0xFF
    lds32 = lambda a: struct.unpack_from('<I', sq, a)[0]
    for warp in range(8):
        for lane in range(32):
            g, t = lane >> 2, lane & 3; arow = (warp >> 2)*64 + (warp & 3)*16 + g
            if arow + 8 >= rows: continue
            qkey = ((g >> 1) & 3) if kT == 'q4' else g
            psel = 0x4342 if t & 1 else 0x4140; wofs = 4*(t >> 1)
            sa = struct.unpack_from('<II', ss, arow*8); sb = struct.unpack_from('<II', ss, (arow+8)*8)
            for blk in range(4):
                wsel = 0x3232 if blk & 1 else 0x1010
                da = bits2f(byte_perm(sa[0] if blk < 2 else sa[1], 0, wsel)); db = bits2f(byte_perm(sb[0] if blk < 2 else sb[1], 0, wsel))
                frags = {}
                if kT == 'q4':
                    ra = arow*64 + ((blk ^ qkey) << 4) + wofs; rb = ra + 8*64
                    xa0, xa1 = byte_perm(lds32(ra), 0, psel), byte_perm(lds32(ra + 8), 0, psel)
                    xb0, xb1 = byte_perm(lds32(rb), 0, psel), byte_perm(lds32(rb + 8), 0, psel)
                    L = lambda x, d: level_pair(x & 0xF000F, 1032, d); H = lambda x, d: level_pair((x >> 4) & 0xF000F, 1032, d)
                    frags[0] = [L(xa0, da), L(xb0, db), L(xa1, da), L(xb1, db)]
                    frags[1] = [H(xa0, da), H(xb0, db), H(xa1, da), H(xb1, db)]
                else:
                    for s in range(2):
                        ra = arow*128 + (((2*blk + s) ^ qkey) << 4) + wofs; rb = ra + 8*128
                        Q = lambda a, d: level_pair(byte_perm(lds32(a), 0, psel) ^ 0x800080, 1152, d)
                        frags[s] = [Q(ra, da), Q(rb, db), Q(ra + 8, da), Q(rb + 8, db)]
                for s in range(2):
                    k0 = 32*blk + 16*s
                    want = lambda r, k: f16(lv[r][k] * sc[r][k // 32])
                    exp = [(want(arow, k0+2*t), want(arow, k0+2*t+1)), (want(arow+8, k0+2*t), want(arow+8, k0+2*t+1)),
                           (want(arow, k0+2*t+8), want(arow, k0+2*t+9)), (want(arow+8, k0+2*t+8), want(arow+8, k0+2*t+9))]
                    assert frags[s] == exp, (kT, warp, lane, blk, s, frags[s], exp)
    # x tile: the cp.async destinations cover the tile once, and logical
    # (token j, column k) sits where the 128-byte swizzle puts it.
    seen = set()
    for j in range(BN):
        for c in range(16):
            off = (c >> 3)*BN*128 + j*128 + (((c & 7) ^ (j & 7)) << 4)
            atom_row, atom_chunk = (off % (BN*128)) // 128, (off % 128) // 16
            assert atom_row == j and atom_chunk ^ (j & 7) == c & 7 and off // (BN*128) == c >> 3
            seen.add(off)
    assert len(seen) == BN*16
    print('v2', kT, BN, 'A fragments and x layout ok')
for kT in ('q4', 'q8'):
    run_v2(kT, 64, 120, 50)

# The overlapping wgmma kernel's schedule (same fragments and layouts as
# the plain one): the ring
# refills stage (i + kStages - 2) % kStages at the top of k-tile i while one
# wgmma group per warpgroup (block 3 of tile i - 1) may be in flight.
# Checks, for every ring size the kernel can pick: k-tile i's cp.async group
# has landed after cp.async.wait_group kAhead - 1; the refilled stage is read
# by no in-flight wgmma and written by no pending copy; the A buffer decoded
# into is not read by the in-flight group (wait_group 1 after each commit).
def schedule_v3(stages, nk):
    ahead = stages - 2
    groups = [t if t < nk else None for t in range(ahead)]  # cp.async groups in commit order: tile or empty
    inflight = []  # wgmma groups of one warpgroup: (tile, block)
    for i in range(nk):
        landed = groups[:len(groups) - (ahead - 1)] if ahead > 1 else groups
        assert i in landed, (stages, nk, i)
        pending = [t for t in groups[len(landed):] if t is not None]
        j = i + ahead; st = j % stages
        assert all(tile % stages != st for tile, _ in inflight), (stages, i, inflight)
        assert all(t % stages != st for t in pending) and st != i % stages, (stages, i, pending)
        groups.append(j if j < nk else None)
        for blk in range(4):
            assert all(b % 2 != blk % 2 for _, b in inflight), (stages, i, blk, inflight)
            inflight.append((i, blk))
            inflight = inflight[-1:]  # wgmma.wait_group 1
for stages in (3, 4, 5):
    for nk in range(1, 12):
        schedule_v3(stages, nk)
print('overlap schedule ok, stages 3, 4, 5')

# The stream-K kernel's bookkeeping (gemm_q_wgmma_streamk_kernel):
# for grids from the host rule (auto, forced, capped by the scratch's slots),
# every (tile, k-tile) unit is computed once; a tile cut by CTA ranges has
# c_last - c_first + 1 pieces (the ticket count the kernel waits for), each
# piece's partial slot (2c for the CTA's first tile, 2c + 1 for its last) is
# the one the summing CTA reads for it, slots are distinct and < 2 * grid;
# whole tiles never touch a ticket.
def ceil_div(a, b): return -(-a // b)
def v4_slots_needed(units, K, p):
    need, c = 0, 0
    while c * p < units:
        u0 = c * p; u1 = min(units, u0 + p); t0 = u0 // K; t1 = (u1 - 1) // K
        if (u1 - u0 != K) if t0 == t1 else (u0 % K != 0): need = max(need, 2 * c + 1)
        if t1 != t0 and u1 % K != 0: need = max(need, 2 * c + 2)
        c += 1
    return need
def v4_grid(tiles, K, sms, force, slots, min_per=4):
    units = tiles * K
    grid0 = tiles * force if force > 0 else min(sms, ceil_div(units, min_per))
    per = ceil_div(units, max(1, min(grid0, units)))
    while v4_slots_needed(units, K, per) > slots: per += 1
    return ceil_div(units, per), per
def check_v4(tiles, K, sms, force, slots):
    grid, per = v4_grid(tiles, K, sms, force, slots)
    units = tiles * K
    done = [0] * units
    pieces = {}  # tile -> {cta: slot}
    for c in range(grid):
        u, u_end = c * per, min(units, c * per + per)
        first_tile = u // K
        assert u < u_end, (tiles, K, grid, per, c)
        while u < u_end:
            tile, kb = u // K, u % K
            ke = min(K, kb + (u_end - u)); nk = ke - kb
            for k in range(kb, ke): done[tile * K + k] += 1
            if nk != K:
                assert per % K != 0  # the host only sets up tickets then
                pieces.setdefault(tile, {})[c] = 2 * c + (0 if tile == first_tile else 1)
            u += nk
    assert all(d == 1 for d in done), (tiles, K, grid, per)
    used = set()
    for tile, pc in pieces.items():
        c_first, c_last = tile * K // per, ((tile + 1) * K - 1) // per
        assert sorted(pc) == list(range(c_first, c_last + 1)), (tile, pc, c_first, c_last)
        for c, slot in pc.items():
            assert slot == 2 * c + (0 if tile == c * per // K else 1) and slot < 2 * grid and slot not in used
            used.add(slot)
    assert len(used) <= slots and all(u < slots for u in used)
for tiles in (1, 2, 3, 8, 17, 32, 64, 86, 172, 250):
    for K in (1, 4, 8, 16, 32, 86):
        for force in (0, 1, 3):
            for slots in (0, 1, 2, 16, 255, 10**6):
                check_v4(tiles, K, 132, force, slots)
# 4096 x 4096 at 256 tokens under gemm()'s own 32 MB scratch (255 slots of
# 128 KB after the tickets): 128 CTAs of 8 k-tiles, slot 2c only.
assert v4_grid(32, 32, 132, 0, 255) == (128, 8)
print('stream-K bookkeeping ok')
