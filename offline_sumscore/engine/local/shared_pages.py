"""One prefix's keys and values held once and mapped into every CPU slot that starts with it.

The rows of one unit share a prompt's prefix (a source and the instruction before it: every claim and question of
one summary). The unit's lead computes the prefix once, and KVSlots.fork used to give every other row a copy of it:
with the 1.5B and a 2,559-word source about 100 MB a row, so ten rows held a gigabyte of the same numbers. On a CPU
the slots' buffers are anonymous mappings (kv_slots.zero_pages), and one row's columns in one (layer, kv head) lie in
one run of memory, so the prefix's whole pages can be mapped rather than copied: SharedPages writes them once into a
memory file (memfd) and maps that file over the same place in each row's slot, the lead's included (whose own pages
are then freed). This is sharing a KV prefix through virtual memory instead of paged attention (the idea of
vAttention, Prabhu et al., 2024): attention reads the slots exactly as before. Nothing past the prefix is shared: its
last part-page and every later column stay each row's own pages, so no row's writes reach another's.

A row's shared prefix is one mapping per (layer, keys or values, kv head): 112 for the 1.5B, made in microseconds.
How it counts: resident memory as the kernel reports it (VmRSS, ru_maxrss, /usr/bin/time's maximum) counts a page
once for every address it is mapped at, so it reads as if each row held its copy; memory in use (PSS, a cgroup's
count, MemAvailable) counts it once. Measure sharing with those (benchmarks/memory_peak.py reads PSS). Memory files
and mapping at an address are Linux's; elsewhere (AVAILABLE false) forks copy, as they did before.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import warnings
import weakref

import torch

PAGE = mmap.PAGESIZE
AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
_MAP_FIXED = 0x10  # Linux's; Python's mmap module does not export it before 3.13
_PROT = mmap.PROT_READ | mmap.PROT_WRITE
_libc_mmap = None


def _mmap():
    """libc's mmap: Python's mmap module cannot map at a given address."""
    global _libc_mmap
    if _libc_mmap is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        _libc_mmap = libc.mmap
    return _libc_mmap


def _map_at(address: int, length: int, flags: int, fd: int, offset: int) -> None:
    got = _mmap()(address, length, _PROT, flags | _MAP_FIXED, fd, offset)
    if got != address:
        err = ctypes.get_errno()
        raise OSError(err, f"mapping {length} bytes of a shared KV prefix at {address:#x}: {os.strerror(err)}")


def column_bytes(buffer: torch.Tensor) -> int:
    return buffer.shape[-1] * buffer.element_size()


def whole_pages(buffer: torch.Tensor, columns: int) -> int:
    """The whole pages within the first `columns` columns of one (slot, kv head) region of a [slots, kv heads,
    columns, dim] buffer; 0 where its regions do not start on a page boundary (nothing can be mapped there)."""
    region = buffer.shape[2] * column_bytes(buffer)
    if region % PAGE or buffer.data_ptr() % PAGE or not buffer.is_contiguous():
        return 0
    return columns * column_bytes(buffer) // PAGE


def page_columns(buffer: torch.Tensor, pages: int) -> int:
    """The columns that `pages` whole pages of one (slot, kv head) region hold: whole_pages the other way."""
    return pages * PAGE // column_bytes(buffer)


def _address(buffer: torch.Tensor, slot: int, head: int) -> int:
    return buffer.data_ptr() + (slot * buffer.shape[1] + head) * buffer.shape[2] * column_bytes(buffer)


class SharedPages:
    """The first `pages` pages of one slot's region in each buffer (and each kv head), written once into a memory
    file; map() puts them in another slot's place. Its memory goes when the last slot mapping it lets go (close)."""

    def __init__(self, buffers: list[torch.Tensor], slot: int, pages: int):
        self.pages, self.heads = pages, buffers[0].shape[1]
        self.slots: set[int] = set()
        self.fd = os.memfd_create("offline_sumscore-kv-prefix", os.MFD_CLOEXEC)
        self._closer = weakref.finalize(self, os.close, self.fd)
        try:
            os.ftruncate(self.fd, len(buffers) * self.heads * pages * PAGE)
            for index, buffer in enumerate(buffers):
                for head in range(self.heads):
                    # the region's bytes read in place (no tensor operation: none that a device would wait for)
                    data = (ctypes.c_char * (pages * PAGE)).from_address(_address(buffer, slot, head))
                    offset, view = self._offset(index, head), memoryview(data).cast("B")
                    while len(view):  # a memory file takes all of it or fails (ENOSPC, ENOMEM); loop anyway
                        written = os.pwrite(self.fd, view, offset)
                        view, offset = view[written:], offset + written
        except BaseException:
            self.close()
            raise

    def _offset(self, index: int, head: int) -> int:
        return (index * self.heads + head) * self.pages * PAGE

    def map(self, index: int, buffer: torch.Tensor, slot: int, pages: int) -> None:
        """The first `pages` of its pages (at most all) over the slot's region in buffer `index`, every kv head."""
        for head in range(self.heads):
            _map_at(_address(buffer, slot, head), pages * PAGE, mmap.MAP_SHARED, self.fd, self._offset(index, head))

    @staticmethod
    def unmap(buffer: torch.Tensor, slot: int, pages: int) -> None:
        """Fresh zero pages over the slot's first `pages` pages, every kv head: what an unwritten slot holds."""
        for head in range(buffer.shape[1]):
            _map_at(_address(buffer, slot, head), pages * PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)

    def close(self) -> None:
        self._closer()


class SlotPrefixes:
    """Which slots of one KV slot set map which shared prefix, and how many of its pages: what KVSlots asks when a
    row forks, is released, or its buffers are replaced."""

    def __init__(self):
        self.held: dict[int, tuple[SharedPages, int]] = {}  # slot -> (its prefix's copy, pages mapped from it)
        self.enabled = True  # until a mapping fails (said once); then forks copy

    def share(self, buffers: list[torch.Tensor], source: int, slots: list[int], n: int, zero_filled: bool) -> int:
        """The whole pages of the source slot's first n columns mapped into the slots' places from one copy (the
        source's own, where it already maps one at least as long); returns the columns now shared, 0 where none are
        (not a CPU's zero pages, less than a page, or a mapping refused: said once, and forks copy from then)."""
        if not (AVAILABLE and zero_filled and self.enabled and buffers):
            return 0
        pages = whole_pages(buffers[0], n)
        if not pages:
            return 0
        try:
            held = self.held.get(source)
            if held is None or held[1] < pages:  # past the pages it maps, the copy may hold another row's
                self._map(buffers, source, SharedPages(buffers, source, pages), pages)
            shared = self.held[source][0]
            for slot in slots:
                self.unshare(buffers, slot)
                self._map(buffers, slot, shared, pages)
        except OSError as exc:  # the slots still read the right values: mapped ones from the copy, the rest their own
            self.enabled = False
            warnings.warn(
                f"A shared prefix could not be mapped into the KV slots ({exc}); each row gets its own copy from now "
                "on, which takes more memory.",
                RuntimeWarning,
                stacklevel=4,
            )
            return 0
        return page_columns(buffers[0], pages)

    def _map(self, buffers: list[torch.Tensor], slot: int, shared: SharedPages, pages: int) -> None:
        """The slot's first pages mapped from `shared` in every buffer: recorded first, so that a failure part way
        still gives the mapped part back when the slot is released."""
        before = self.held.get(slot)
        self.held[slot] = (shared, pages)
        shared.slots.add(slot)
        if before is not None and before[0] is not shared:
            self._let_go(before[0], slot)
        for index, buffer in enumerate(buffers):
            shared.map(index, buffer, slot, pages)

    def unshare(self, buffers: list[torch.Tensor], slot: int) -> None:
        """The slot's shared prefix, if any, unmapped (zero pages in its place)."""
        held = self.held.pop(slot, None)
        if held is None:
            return
        shared, pages = held
        for buffer in buffers:
            SharedPages.unmap(buffer, slot, pages)
        self._let_go(shared, slot)

    def carry(self, index: int, new: torch.Tensor, slot: int, n: int) -> int:
        """A replaced buffer's new one (number `index`): the slot's shared prefix mapped there again; returns the
        columns it covers (0 where the slot maps none), which need no copy."""
        if slot not in self.held or not whole_pages(new, n):
            return 0
        shared, pages = self.held[slot]
        shared.map(index, new, slot, pages)
        return page_columns(new, pages)

    def columns(self, buffers: list[torch.Tensor]) -> dict[int, int]:
        """Each slot whose first columns are a shared prefix: how many (the rest of its prefix is its own)."""
        if not (self.held and buffers):
            return {}
        return {slot: page_columns(buffers[0], pages) for slot, (_, pages) in self.held.items()}

    def close(self) -> None:
        for shared, _ in self.held.values():
            shared.close()
        self.held = {}

    @staticmethod
    def _let_go(shared: SharedPages, slot: int) -> None:
        shared.slots.discard(slot)
        if not shared.slots:
            shared.close()
