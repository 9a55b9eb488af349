# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled read of a kernel-stamped socket (issue 24): ``recv_stamped`` and ``dispatch``.

``recv_stamped`` is :func:`chaoslib_infer.load.kerneltime.recv_stamped` (the pure-Python
reference, whose docstring holds the definitions) in C: one ``recvmsg`` into a reused buffer, the
software receive stamp taken from the ancillary data without building Python tuples, and the
stamp converted to the ``time.perf_counter`` clock (``CLOCK_MONOTONIC`` on Linux) with the offset
read at that moment. ``dispatch`` is :class:`chaoslib_infer.load.kerneltime.Poller`'s turn: one
``epoll_wait`` of the inner set (no timeout) and each ready descriptor's handler called.

Same results on the same reads as the pure path (tests/test_recv_path.py). Built by ``setup.py``
with ``_ssefast``; :mod:`chaoslib_infer.measure.chunkpath` chooses both or neither.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport int64_t
from libc.string cimport strerror
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec


cdef extern from "<errno.h>" nogil:
    int EWOULDBLOCK


cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len


cdef extern from "<sys/socket.h>" nogil:
    struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    ssize_t recvmsg(int fd, msghdr *msg, int flags)
    cmsghdr *CMSG_FIRSTHDR(msghdr *msg)
    cmsghdr *CMSG_NXTHDR(msghdr *msg, cmsghdr *cmsg)
    unsigned char *CMSG_DATA(cmsghdr *cmsg)
    size_t CMSG_LEN(size_t n)
    int SOL_SOCKET


cdef extern from "<sys/epoll.h>" nogil:
    union epoll_data_t:
        int fd
    struct epoll_event:
        unsigned int events
        epoll_data_t data
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)


cdef extern from *:
    """
    #include <linux/types.h>
    #include <asm/socket.h>
    /* the _OLD numbers: struct timespec of native longs, as kerneltime's struct "@ll" */
    #ifdef SO_TIMESTAMPING_OLD
    #define CI_SO_TIMESTAMPNS SO_TIMESTAMPNS_OLD
    #define CI_SO_TIMESTAMPING SO_TIMESTAMPING_OLD
    #else
    #define CI_SO_TIMESTAMPNS SO_TIMESTAMPNS
    #define CI_SO_TIMESTAMPING SO_TIMESTAMPING
    #endif
    """
    int CI_SO_TIMESTAMPNS
    int CI_SO_TIMESTAMPING


cdef enum:
    BUF_SIZE = 65536  # the raw transport's read size (rawconn._READ_SIZE)
    ANC_SIZE = 256  # room for an scm_timestamping (3 timespecs) and more
    MAX_EVENTS = 512  # Poller's epoll.poll(0, 512)

# One buffer for every read: the GIL is held from recvmsg to the copy into a bytes object
# (no Python code in between), so threads with their own loops never share it mid-read.
cdef char _buf[BUF_SIZE]
cdef char _anc[ANC_SIZE]


cdef inline double _clock(int which) noexcept nogil:
    cdef timespec ts
    clock_gettime(which, &ts)
    # as CPython's _PyTime_AsSecondsDouble: integer nanoseconds, then one division
    return <double>(<int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9


def recv_stamped(int fd, Py_ssize_t size, double floor):
    """``kerneltime.recv_stamped`` on the descriptor ``fd`` (its docstring): ``None`` when
    there was nothing to read, else ``(data, t, now, stamped)``; ``data`` is ``b""`` at EOF.

    Raises:
        OSError: the read failed (reset, bad descriptor).
    """
    cdef msghdr msg
    cdef iovec iov
    cdef cmsghdr *c
    cdef long *ts
    cdef ssize_t n
    cdef double now, wall, stamp = 0.0, t
    cdef bint stamped = False
    if size > BUF_SIZE:
        size = BUF_SIZE
    iov.iov_base = _buf
    iov.iov_len = <size_t>size
    msg.msg_name = NULL
    msg.msg_namelen = 0
    msg.msg_iov = &iov
    msg.msg_iovlen = 1
    msg.msg_control = _anc
    msg.msg_controllen = ANC_SIZE
    msg.msg_flags = 0
    n = recvmsg(fd, &msg, 0)  # non-blocking descriptor; GIL held (the buffer above)
    if n < 0:
        if errno == EAGAIN or errno == EWOULDBLOCK or errno == EINTR:
            return None
        raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
    now = _clock(CLOCK_MONOTONIC)
    wall = _clock(CLOCK_REALTIME)  # read together: the stamp's offset
    if n == 0:
        return b"", now, now, False
    c = CMSG_FIRSTHDR(&msg)
    while c != NULL:
        if (
            c.cmsg_level == SOL_SOCKET
            and (c.cmsg_type == CI_SO_TIMESTAMPING or c.cmsg_type == CI_SO_TIMESTAMPNS)
            and c.cmsg_len >= CMSG_LEN(2 * sizeof(long))
        ):
            ts = <long *>CMSG_DATA(c)  # ts[0]: the software stamp
            if ts[0] or ts[1]:
                stamp = <double>ts[0] + <double>ts[1] * 1e-9
                stamped = True
                break  # kerneltime.rx_stamp: the first non-zero stamp
        c = CMSG_NXTHDR(&msg, c)
    data = PyBytes_FromStringAndSize(_buf, n)
    if not stamped:
        return data, now, now, False
    t = now - (wall - stamp) if wall > stamp else now
    if t < floor:
        t = floor
    return data, t, now, True


def dispatch(int epfd, dict handlers):
    """One turn of ``kerneltime.Poller``: ``epoll_wait`` on ``epfd`` without waiting, then
    ``handlers[fd]()`` for each ready descriptor that has one, in the kernel's order.

    Raises:
        OSError: ``epoll_wait`` failed (a closed set); whatever a handler raises.
    """
    cdef epoll_event events[MAX_EVENTS]  # on the stack: handlers may let another thread run
    cdef int n, i
    n = epoll_wait(epfd, events, MAX_EVENTS, 0)
    if n < 0:
        if errno == EINTR:
            return
        raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
    for i in range(n):
        h = handlers.get(events[i].data.fd)
        if h is not None:
            h()
