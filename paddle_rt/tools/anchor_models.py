"""The anchors of ``replay --baselines`` and ``replay --corpus``: faithful models of Paddle's auto-growth allocator
and of PyTorch's caching allocator on an unbounded device, run over a trace as :func:`paddle_rt.tools.replay.load_trace`
returns it."""
import bisect

MiB = 1 << 20


class _Model:
    """A chunked best-fit allocator model: chunks of blocks, free index sorted by (size, address)."""

    def __init__(self):
        self.free = [[], []]
        self.blk = {}         # addr -> [size, free, pool, prev, next]
        self.next_addr = 1 << 40
        self.reserved = self.peak = self.device_allocs = 0

    def _new_chunk(self, size, pool):
        a = self.next_addr
        self.next_addr += size + (1 << 30)
        self.reserved += size
        self.peak = max(self.peak, self.reserved)
        self.device_allocs += 1
        self.blk[a] = [size, True, pool, None, None]
        bisect.insort(self.free[pool], (size, a))
        return a

    def _take(self, pool, size, low_remainder, may_split):
        i = bisect.bisect_left(self.free[pool], (size, -1))
        if i == len(self.free[pool]):
            return None
        bsize, a = self.free[pool].pop(i)
        b = self.blk[a]
        rest = bsize - size
        if rest and may_split(pool, rest):
            if low_remainder:
                na = self._split(pool, a, rest, size, False)
                bisect.insort(self.free[pool], (rest, a))
                return na
            na = self._split(pool, a, size, rest, True)
            bisect.insort(self.free[pool], (rest, na))
        b[1] = False
        return a

    def _split(self, pool, a, keep, tail, tail_free):
        """Block a keeps its first `keep` bytes; a new block of `tail` bytes (free or not) follows it. Returns the
        new block's address."""
        b = self.blk[a]
        na = a + keep
        self.blk[na] = [tail, tail_free, pool, a, b[4]]
        if b[4] is not None:
            self.blk[b[4]][3] = na
        b[0], b[4] = keep, na
        return na

    def release(self, a):
        b = self.blk[a]
        pool = b[2]
        b[1] = True
        p = b[3]
        if p is not None and self.blk[p][1]:
            self._join(pool, p, a, listed=p)
            a, b = p, self.blk[p]
        n = b[4]
        if n is not None and self.blk[n][1]:
            self._join(pool, a, n, listed=n)
        bisect.insort(self.free[pool], (b[0], a))

    def _join(self, pool, lo, hi, listed):
        """Block lo absorbs its successor hi; `listed` (the one of the two on pool's free list) leaves the list."""
        lb, hb = self.blk[lo], self.blk[hi]
        self.free[pool].remove((self.blk[listed][0], listed))
        lb[0] += hb[0]
        lb[4] = hb[4]
        if hb[4] is not None:
            self.blk[hb[4]][3] = lo
        del self.blk[hi]


class PaddleAutoGrowthModel(_Model):
    """Paddle's auto_growth best fit (as in paddlepaddle 3.3.1): round_up(n + padding, min_chunk), exact chunks, remainder low."""

    def __init__(self, align=256, padding=0):
        super().__init__()
        self.align, self.padding = align, padding

    def malloc(self, n):
        size = max(1, -(-(n + self.padding) // self.align)) * self.align
        a = self._take(1, size, True, lambda p, r: True)
        if a is None:
            self._new_chunk(size, 1)
            a = self._take(1, size, True, lambda p, r: True)
        return a


class TorchCachingModel(_Model):
    """PyTorch's CUDA caching allocator (default config) as traces/README.md describes it."""

    def malloc(self, n):
        size = 512 if n < 512 else -(-n // 512) * 512
        pool = 0 if size <= MiB else 1
        split = (lambda p, r: r >= 512) if pool == 0 else (lambda p, r: r > MiB)
        a = self._take(pool, size, False, split)
        if a is None:
            if pool == 0:
                seg = 2 * MiB
            elif size < 10 * MiB:
                seg = 20 * MiB
            else:
                seg = -(-size // (2 * MiB)) * (2 * MiB)
            self._new_chunk(seg, pool)
            a = self._take(pool, size, False, split)
        return a


def run_model(model, trace):
    is_alloc, sizes, slots, nslots, peak = trace
    table = [0] * nslots
    for a, n, s in zip(is_alloc.tolist(), sizes.tolist(), slots.tolist()):
        if a:
            table[s] = model.malloc(n)
        else:
            model.release(table[s])
    return {"peak_reserved": model.peak, "device_allocs": model.device_allocs}
