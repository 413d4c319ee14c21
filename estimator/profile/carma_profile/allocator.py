"""A model of PyTorch's CUDA caching allocator, replayed over a traced training step.

The trace knows every tensor storage a training step creates and frees, in order. What
`nvidia-smi` shows is not their peak sum but the segments the caching allocator took from
the driver (`torch.cuda.max_memory_reserved`), which it never gives back during training:
freed blocks stay cached for reuse, and a cached block too small for the next request, or
split off a larger one, is memory no tensor uses. On an H100 this fragmentation was 0.3 to
2.4 GiB per job (`docs/h100-measurements.md`), the largest error of the traced estimate.

The model follows the allocator's documented rules with its default configuration
(c10/cuda/CUDACachingAllocator.cpp, no `PYTORCH_CUDA_ALLOC_CONF`, one stream):

* a request is rounded up to a multiple of 512 bytes;
* requests of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger ones
  from the large pool, whose segments are 20 MiB for requests under 10 MiB and the request
  rounded up to 2 MiB otherwise;
* a request takes the smallest cached block of its pool that fits (ties: lowest address),
  else a new segment;
* a block larger than the request is split when the rest is at least 512 bytes (small pool)
  or more than 1 MiB (large pool); the rest is cached;
* a freed block merges with free neighbours of its segment; segments are not released.

Not modelled: memory that operators allocate inside a kernel call and the trace cannot see
(cuBLAS and cuDNN workspaces), several streams, `expandable_segments`, `max_split_size_mb`.
"""

from __future__ import annotations

from bisect import bisect_left, insort

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: below it a large request gets a 20 MiB segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to it


class Block:
    __slots__ = ("addr", "size", "small", "free", "prev", "next")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr, self.size, self.small = addr, size, small
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None


def round_size(nbytes: int) -> int:
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """Segments reserved and blocks handed out, by the rules in the module's doc comment."""

    def __init__(self) -> None:
        # Per pool (small: True), the cached blocks as sorted (size, address) keys.
        self._cached: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._by_addr: dict[int, Block] = {}
        self._next_addr = 0
        self.reserved = 0
        self.allocated = 0
        self.peak_allocated = 0

    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._cached[small]
        i = bisect_left(pool, (size, -1))
        if i < len(pool):
            _, addr = pool.pop(i)
            block = self._by_addr[addr]
        else:
            seg = segment_size(size)
            block = Block(self._next_addr, seg, small)
            self._next_addr += seg + SMALL_BUFFER  # segments are never adjacent: no merging across them
            self._by_addr[block.addr] = block
            self.reserved += seg
        rest = block.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            tail = Block(block.addr + size, rest, small)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._by_addr[tail.addr] = tail
            insort(pool, (tail.size, tail.addr))
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        if block.free:
            return
        self.allocated -= block.size
        block.free = True
        pool = self._cached[block.small]
        for nb in (block.prev, block.next):
            if nb is not None and nb.free:
                pool.remove((nb.size, nb.addr))
                del self._by_addr[nb.addr]
                if nb is block.prev:
                    nb.size += block.size
                    nb.next = block.next
                    if block.next is not None:
                        block.next.prev = nb
                    del self._by_addr[block.addr]
                    self._by_addr[nb.addr] = nb
                    block = nb
                else:
                    block.size += nb.size
                    block.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = block
        insort(pool, (block.size, block.addr))
