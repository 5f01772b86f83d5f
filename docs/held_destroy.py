# Takes an async event and does not acknowledge it, then destroys the CQ
# the event is about: the destroy waits, as rdma-core's does.
import ctypes, threading, time

v = ctypes.CDLL("libibverbs.so.1")
v.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
v.ibv_open_device.restype = ctypes.c_void_p
v.ibv_open_device.argtypes = [ctypes.c_void_p]
v.ibv_create_cq.restype = ctypes.c_void_p
v.ibv_create_cq.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
v.ibv_destroy_cq.argtypes = [ctypes.c_void_p]

class AsyncEvent(ctypes.Structure):  # struct ibv_async_event
    _fields_ = [("element", ctypes.c_void_p), ("event_type", ctypes.c_int)]

ctx = v.ibv_open_device(v.ibv_get_device_list(None)[0])
cq = v.ibv_create_cq(ctx, 16, None, None, 0)
ev = AsyncEvent(cq, 0)                      # IBV_EVENT_CQ_ERR on our CQ
v.rdmaemu_raise_async_event(ctypes.c_void_p(ctx), ctypes.byref(ev))
got = AsyncEvent()
v.ibv_get_async_event(ctypes.c_void_p(ctx), ctypes.byref(got))
print("got event", got.event_type, "- not acknowledged yet")

t0 = time.time()
def destroy():
    print("ibv_destroy_cq returned", v.ibv_destroy_cq(cq), "after %.1f s" % (time.time() - t0))
th = threading.Thread(target=destroy); th.start()
time.sleep(2.5)
print("acknowledging the event")
v.ibv_ack_async_event(ctypes.byref(got))
th.join()
