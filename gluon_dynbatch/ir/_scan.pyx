# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled scan of a graph before it runs (``graph.Graph.live_and_needed``),
and the copy of a flush's index arrays into MXNet (``dlpack_copy``).

A scope whose samples read values flushes once per round of reads; each
flush visits every pending node once, so the visit is compiled.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy

cdef extern from "stdlib.h":
    int posix_memalign(void** ptr, size_t alignment, size_t size) nogil

cdef str LEAF = "leaf"


def live_and_needed(list nodes):
    """``(live, needed)`` of ``nodes`` in creation order (see ``Graph.live_and_needed``)."""
    cdef Py_ssize_t n = len(nodes), k, idx
    cdef bytearray marks = bytearray(n)
    cdef unsigned char[::1] mark = marks
    cdef list live = [], needed, outs
    cdef object node, ref, lazy, value
    for k in range(n - 1, -1, -1):
        node = nodes[k]
        outs = node.outs
        if outs is not None and node.kind != LEAF:
            for idx in range(len(outs) - 1, -1, -1):
                ref = outs[idx]
                if ref is None:
                    continue
                lazy = ref()
                if lazy is not None and lazy._h is None:     # held and pending
                    live.append((node, idx, lazy))
                    mark[k] = 1
        if mark[k]:
            for value in node.inputs:
                mark[<Py_ssize_t>value[0].id] = 1
    live.reverse()
    needed = [nodes[k] for k in range(n) if mark[k]]
    return live, needed


# -- arrays handed to MXNet through DLPack ----------------------------------------------
# The DLPack structs (dlpack.h, the layout MXNet 1.9 reads).
ctypedef struct DLDevice:
    int device_type
    int device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void* data
    DLDevice device
    int ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept nogil

cdef size_t _HEADER = 128       # DLManagedTensor and the shape, ahead of the data


cdef void _free_managed(DLManagedTensor* managed) noexcept nogil:
    # One block holds the struct, the shape and the data: no Python object is
    # involved, so MXNet may call this from any thread, at any time.
    free(managed)


cdef void _free_capsule(object capsule) noexcept:
    # A capsule never consumed (MXNet renames the ones it takes over).
    if PyCapsule_IsValid(capsule, "dltensor"):
        _free_managed(<DLManagedTensor*>PyCapsule_GetPointer(capsule, "dltensor"))


def dlpack_copy(const unsigned char[::1] raw, tuple shape, int code, int bits):
    """A "dltensor" capsule holding a copy of the bytes ``raw`` (a C-contiguous
    array's) as a CPU array of ``shape`` and DLPack type ``(code, bits)``, for
    ``mx.nd.from_dlpack``.

    The copy is made here, 64-byte aligned, in memory freed by plain C when
    MXNet frees the array: making the NDArray involves no engine operation
    (``mx.nd.array`` waits for everything the engine has queued first).
    """
    cdef Py_ssize_t ndim = len(shape), k
    cdef size_t nbytes = raw.shape[0]
    cdef void* block = NULL
    if ndim * sizeof(int64_t) + sizeof(DLManagedTensor) > _HEADER:
        raise ValueError("dlpack_copy: %d dimensions are too many" % ndim)
    if posix_memalign(&block, 64, _HEADER + (nbytes if nbytes else 1)) != 0:
        raise MemoryError()
    cdef DLManagedTensor* managed = <DLManagedTensor*>block
    cdef int64_t* dims = <int64_t*>(<char*>block + sizeof(DLManagedTensor))
    cdef char* data = <char*>block + _HEADER
    for k in range(ndim):
        dims[k] = shape[k]
    if nbytes:
        memcpy(data, &raw[0], nbytes)
    managed.dl_tensor.data = data
    managed.dl_tensor.device.device_type = 1        # kDLCPU
    managed.dl_tensor.device.device_id = 0
    managed.dl_tensor.ndim = <int>ndim
    managed.dl_tensor.dtype.code = <uint8_t>code
    managed.dl_tensor.dtype.bits = <uint8_t>bits
    managed.dl_tensor.dtype.lanes = 1
    managed.dl_tensor.shape = dims
    managed.dl_tensor.strides = NULL                # compact, row-major
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = NULL
    managed.deleter = _free_managed
    return PyCapsule_New(managed, "dltensor", _free_capsule)
