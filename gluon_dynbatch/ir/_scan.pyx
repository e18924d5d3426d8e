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

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.weakref cimport PyWeakref_GetObject


cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset

cdef extern from "descrobject.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


def slot_offset(cls, name):
    """Where instances of ``cls`` keep slot ``name`` (bytes from the object's
    start), for compiled code that reads and writes slots directly."""
    descr = None
    for klass in cls.__mro__:
        if name in klass.__dict__:
            descr = klass.__dict__[name]
            break
    if type(descr).__name__ != "member_descriptor":
        raise TypeError("%s.%s is not a slot" % (cls.__name__, name))
    return (<PyMemberDescrObject*>descr).d_member.offset


cdef Py_ssize_t N_ID = -1, N_KIND, N_INPUTS, N_OUTS, L_H
cdef object NODE = None, LAZY = None


def bind(node_class, lazy_class):
    """Learn the slots of ``graph.Node`` and of LazyArray the scan reads."""
    global N_ID, N_KIND, N_INPUTS, N_OUTS, L_H, NODE, LAZY
    NODE, LAZY = node_class, lazy_class
    N_KIND = slot_offset(node_class, "kind")
    N_INPUTS = slot_offset(node_class, "inputs")
    N_OUTS = slot_offset(node_class, "outs")
    L_H = slot_offset(lazy_class, "_h")
    N_ID = slot_offset(node_class, "id")


cdef inline PyObject* _slot(object o, Py_ssize_t off):
    """Slot ``off`` of ``o``, borrowed (NULL when never set)."""
    return (<PyObject**>((<char*><PyObject*>o) + off))[0]


def live_and_needed(list nodes):
    """``(live, needed)`` of ``nodes`` in creation order (see ``Graph.live_and_needed``)."""
    cdef Py_ssize_t n = len(nodes), k, idx, m
    cdef bytearray marks = bytearray(n)
    cdef unsigned char[::1] mark = marks
    cdef list live = [], needed
    cdef object node, lazy
    cdef PyObject* outs
    cdef PyObject* ref
    cdef PyObject* inputs
    cdef PyObject* found
    if N_ID < 0:
        raise RuntimeError("_scan.bind was not called")
    for k in range(n - 1, -1, -1):
        node = <object>PyList_GET_ITEM(nodes, k)
        if type(node) is not NODE:          # (the offsets are those of Node's slots)
            raise TypeError("not a graph node: %r" % (node,))
        outs = _slot(node, N_OUTS)
        if outs != NULL and <object>outs is not None \
                and <object>_slot(node, N_KIND) != LEAF:
            m = PyList_GET_SIZE(<object>outs)
            for idx in range(m - 1, -1, -1):
                ref = PyList_GET_ITEM(<object>outs, idx)
                if <object>ref is None:
                    continue
                found = PyWeakref_GetObject(<object>ref)
                if isinstance(<object>found, LAZY) and _slot(<object>found, L_H) != NULL \
                        and <object>_slot(<object>found, L_H) is None:
                    live.append((node, idx, <object>found))     # held and pending
                    mark[k] = 1
        if mark[k]:
            inputs = _slot(node, N_INPUTS)
            for value in <object>inputs:
                mark[<Py_ssize_t>PyLong_AsSsize_t(<object>_slot(
                    <object>PyTuple_GET_ITEM(value, 0), N_ID))] = 1
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
