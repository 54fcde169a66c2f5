package io.gpumemd.server.backend.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGetAttribute;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDeviceGetCount;
import static jcuda.driver.JCudaDriver.cuDeviceGetName;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRelease;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuDeviceTotalMem;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventQuery;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuIpcGetMemHandle;
import static jcuda.driver.JCudaDriver.cuIpcOpenEventHandle;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemGetInfo;
import static jcuda.driver.JCudaDriver.cuMemsetD8;

import io.gpumemd.common.cuda.CudaHandles;
import io.gpumemd.common.cuda.CudaUuids;
import io.gpumemd.common.cuda.DeviceUuidDriver;
import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.server.backend.AbstractMemoryBackend;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.InvalidEventHandleException;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUipcMemHandle;
import jcuda.driver.CUdevice_attribute;
import jcuda.driver.CUresult;
import jcuda.driver.JCudaDriver;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@code cuda} backend on JCuda's driver API: one primary context per device, {@code
 * cuMemsetD8} for zeroing, and {@code cuIpcOpenEventHandle} + {@code cuEventQuery} for clients'
 * completion events. Segments are of one of two kinds per device ({@code --cuda-handles}, {@link
 * CudaHandleChoice}):
 *
 * <ul>
 *   <li><b>vmm:</b> {@code cuMemCreate} allocations, multiples of the device's granularity,
 *       mapped in the daemon's context too and handed to clients as POSIX file descriptors over
 *       the fd channel ({@link VmmAllocations}, {@link VmmSegment}); they open across PID
 *       namespaces.
 *   <li><b>legacy:</b> one {@code cuMemAlloc} per segment with its {@code cuIpcGetMemHandle}
 *       taken once, {@code cuMemFree} on eviction ({@link CudaSegment}); they open only within
 *       the daemon's PID namespace.
 * </ul>
 *
 * <p>Thread-safety: every method makes the device's primary context current on the calling
 * thread first (a cheap driver call), so any thread may call any method concurrently; the
 * driver serializes what needs it. Live segments are tracked in a concurrent set so that
 * {@link #close} frees what is left.
 */
public final class JCudaBackend extends AbstractMemoryBackend {
  private static final Logger log = LoggerFactory.getLogger(JCudaBackend.class);

  private final CUcontext[] contexts;
  private final CUdevice[] handles;
  /** Per device: its VMM allocations, or null where it uses legacy handles. */
  private final VmmAllocations[] vmm;
  private final Set<DeviceSegment> live = ConcurrentHashMap.newKeySet();

  private JCudaBackend(List<DeviceInfo> devices, CUcontext[] contexts, CUdevice[] handles, VmmAllocations[] vmm) {
    super("cuda", devices);
    this.contexts = contexts;
    this.handles = handles;
    this.vmm = vmm;
  }

  /**
   * Loads the driver and counts devices without keeping anything open.
   *
   * @return the number of CUDA devices
   * @throws BackendException (or a {@link LinkageError} from loading the natives) when CUDA
   *     cannot be used here; the message says why
   */
  public static int probe() {
    JCudaDriver.setExceptionsEnabled(false);
    CudaCalls.check(cuInit(0), "cuInit");
    int[] count = new int[1];
    CudaCalls.check(cuDeviceGetCount(count), "cuDeviceGetCount");
    return count[0];
  }

  /** Discovers every device and retains its primary context; legacy handles everywhere. */
  public static JCudaBackend open() {
    return open("legacy", null);
  }

  /**
   * Discovers every device, retains its primary context and decides its handles, logging the
   * decision and its reason once per device.
   *
   * @param cudaHandles {@code auto}, {@code vmm} or {@code legacy} ({@code --cuda-handles})
   * @param fdSocket the fd channel's socket that VMM handles name, or null when the daemon has none
   * @throws BackendException when CUDA cannot be used, or {@code vmm} is asked for where it
   *     cannot work (the message says why)
   */
  public static JCudaBackend open(String cudaHandles, String fdSocket) {
    int count = probe();
    if (count == 0) {
      throw new BackendException("the CUDA driver reports no devices");
    }
    List<DeviceInfo> infos = new ArrayList<>();
    CUcontext[] contexts = new CUcontext[count];
    CUdevice[] handles = new CUdevice[count];
    VmmAllocations[] vmm = new VmmAllocations[count];
    try {
      for (int d = 0; d < count; d++) {
        infos.add(openDevice(d, contexts, handles, vmm, cudaHandles, fdSocket));
      }
    } catch (RuntimeException e) {
      for (int d = 0; d < count; d++) {
        if (contexts[d] != null) {
          cuDevicePrimaryCtxRelease(handles[d]);
        }
      }
      throw e;
    }
    return new JCudaBackend(List.copyOf(infos), contexts, handles, vmm);
  }

  /** Opens one device: its facts, its primary context, its handles. */
  private static DeviceInfo openDevice(int d, CUcontext[] contexts, CUdevice[] handles, VmmAllocations[] vmm,
      String cudaHandles, String fdSocket) {
    CUdevice device = new CUdevice();
    CudaCalls.check(cuDeviceGet(device, d), "cuDeviceGet(" + d + ")");
    byte[] name = new byte[256];
    CudaCalls.check(cuDeviceGetName(name, name.length, device), "cuDeviceGetName(" + d + ")");
    long[] total = new long[1];
    CudaCalls.check(cuDeviceTotalMem(total, device), "cuDeviceTotalMem(" + d + ")");
    // Not JCuda's cuDeviceGetUuid: it binds the first version, which names a MIG instance by its
    // parent GPU (DeviceUuidDriver); clients read _v2, so the daemon must too.
    byte[] uuid = new byte[CudaUuids.UUID_BYTES];
    CudaCalls.check(DeviceUuidDriver.uuid(d, uuid), DeviceUuidDriver.symbol() + "(" + d + ")");
    CUcontext context = new CUcontext();
    CudaCalls.check(cuDevicePrimaryCtxRetain(context, device), "cuDevicePrimaryCtxRetain(" + d + ")");
    contexts[d] = context; // retained: released by the caller if anything below fails
    handles[d] = device;
    CudaCalls.check(cuCtxSetCurrent(context), "cuCtxSetCurrent(" + d + ")");
    long[] free = new long[1];
    long[] totalNow = new long[1];
    CudaCalls.check(cuMemGetInfo(free, totalNow), "cuMemGetInfo(" + d + ")");
    CudaHandleChoice.DeviceSupport support = new CudaHandleChoice.DeviceSupport(d, cString(name),
        attribute(device, CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
        attribute(device, CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
    CudaHandleChoice.Decision decision = CudaHandleChoice.decide(cudaHandles, support, fdSocket != null);
    if (decision.vmm()) {
      vmm[d] = new VmmAllocations(d, context, fdSocket);
      log.info("Device {}: CUDA handles vmm ({}); segments are multiples of {} bytes, passed as file descriptors "
          + "over {}", d, decision.reason(), vmm[d].granularity(), fdSocket);
    } else {
      log.info("Device {}: CUDA handles legacy ({}); clients open them only within the daemon's PID namespace",
          d, decision.reason());
    }
    return new DeviceInfo(d, cString(name), formatUuid(uuid), "cuda", total[0], free[0], decision.handles());
  }

  /** A boolean device attribute; an attribute the driver does not know reads as unsupported. */
  private static boolean attribute(CUdevice device, int attribute) {
    int[] value = new int[1];
    return cuDeviceGetAttribute(value, attribute, device) == CUresult.CUDA_SUCCESS && value[0] != 0;
  }

  private static String cString(byte[] bytes) {
    int end = 0;
    while (end < bytes.length && bytes[end] != 0) {
      end++;
    }
    return new String(bytes, 0, end, StandardCharsets.UTF_8);
  }

  /** {@code GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}, as nvidia-smi prints it. */
  static String formatUuid(byte[] b) {
    StringBuilder s = new StringBuilder("GPU-");
    for (int i = 0; i < 16; i++) {
      if (i == 4 || i == 6 || i == 8 || i == 10) {
        s.append('-');
      }
      s.append(String.format("%02x", b[i] & 0xff));
    }
    return s.toString();
  }

  private void makeCurrent(int device) {
    CudaCalls.check(cuCtxSetCurrent(contexts[device]), "cuCtxSetCurrent(" + device + ")");
  }

  /**
   * {@inheritDoc} The owner is not used: a CUDA handle carries no user identity (the fd channel
   * gives a VMM descriptor only to a holder of the segment), and the pool zeroes fresh segments
   * since neither {@code cuMemAlloc} nor {@code cuMemCreate} memory is initialized.
   */
  @Override
  public SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
    checkOpen();
    makeCurrent(device);
    checkRoom(device, bytes);
    if (vmm[device] != null) {
      VmmSegment segment = vmm[device].allocate(bytes);
      live.add(segment);
      return segment;
    }
    CUdeviceptr pointer = new CUdeviceptr();
    CudaCalls.check(cuMemAlloc(pointer, bytes), "cuMemAlloc(" + bytes + ") on device " + device);
    try {
      CUipcMemHandle handle = new CUipcMemHandle();
      CudaCalls.check(cuIpcGetMemHandle(handle, pointer), "cuIpcGetMemHandle on device " + device);
      CudaSegment segment = new CudaSegment(device, bytes, pointer, new IpcHandle.CudaIpc(CudaHandles.bytes(handle)));
      live.add(segment);
      return segment;
    } catch (RuntimeException e) {
      cuMemFree(pointer);
      throw e;
    }
  }

  /**
   * Refuses a segment the device cannot hold by the driver's own count ({@code cuMemGetInfo}),
   * naming how much of the device is in use outside this daemon's live segments: other
   * processes, driver contexts, and VMM segments this daemon released that a client still maps
   * ({@code cuMemRelease} frees nothing while another process maps the allocation). Without it
   * such memory would be handed out again by the daemon's budget; a real driver may then fail
   * or, where memory can be oversubscribed, fault later.
   */
  private void checkRoom(int device, long bytes) {
    long[] free = new long[1];
    long[] total = new long[1];
    CudaCalls.check(cuMemGetInfo(free, total), "cuMemGetInfo(" + device + ")");
    if (free[0] < bytes) {
      throw new BackendOutOfMemoryException("device " + device + " has " + free[0] + " of " + total[0]
          + " bytes free by the driver's count for a " + bytes + "-byte segment; "
          + outsideBooks(device, free[0], total[0]) + " bytes of it are in use outside gpumemd's books (other "
          + "processes, driver contexts, or released segments a client still maps)");
    }
  }

  /** Device memory in use that this backend's live segments do not explain. */
  private long outsideBooks(int device, long free, long total) {
    long ours = 0;
    for (DeviceSegment segment : live) {
      if (segment.device() == device) {
        ours += segment.bytes();
      }
    }
    return Math.max(0, total - free - ours);
  }

  /**
   * {@inheritDoc} By {@code cuMemGetInfo}: what the device has in use minus this daemon's live
   * segments.
   */
  @Override
  public long bytesOutsideBooks(int device) {
    if (isClosed()) {
      return -1;
    }
    makeCurrent(device);
    long[] free = new long[1];
    long[] total = new long[1];
    if (cuMemGetInfo(free, total) != CUresult.CUDA_SUCCESS) {
      return -1;
    }
    return outsideBooks(device, free[0], total[0]);
  }

  @Override
  public void free(SegmentMemory segment) {
    DeviceSegment cuda = (DeviceSegment) segment;
    if (!live.remove(cuda)) {
      return;
    }
    try {
      makeCurrent(cuda.device());
      if (cuda instanceof VmmSegment allocation) {
        vmm[cuda.device()].release(allocation);
      } else {
        CudaCalls.check(cuMemFree(cuda.pointer()), "cuMemFree on device " + cuda.device());
      }
    } catch (BackendException e) {
      log.error("Cannot free a {}-byte segment on device {}: {}", cuda.bytes(), cuda.device(), e.getMessage());
    }
  }

  /** A GPU is the one its UUID names: the same ordinal is another GPU under another CUDA_VISIBLE_DEVICES. */
  @Override
  public boolean devicesMatchByUuid() {
    return true;
  }

  /**
   * Null when every device uses VMM handles: a VMM allocation lives on while the successor's
   * imported handle holds it. Legacy IPC handles ({@code cuMemAlloc}) die with this process.
   */
  @Override
  public String takeOverRefusal() {
    for (int d = 0; d < vmm.length; d++) {
      if (vmm[d] == null) {
        return "device " + d + " uses legacy CUDA IPC handles (cuMemAlloc), whose memory dies with this daemon; "
            + "restart the daemon with --cuda-handles vmm to allow take-overs";
      }
    }
    return null;
  }

  /**
   * Imports a VMM allocation from a descriptor and maps it in the daemon ({@link
   * VmmAllocations#adopt}); the segment keeps the descriptor, which is closed if that fails.
   */
  @Override
  public SegmentMemory adopt(int device, int fd, long bytes) {
    VmmSegment segment = null;
    try {
      checkOpen();
      if (device < 0 || device >= vmm.length || vmm[device] == null) {
        throw new UnsupportedOperationException(device < 0 || device >= vmm.length
            ? "adopt: device " + device + " (expected: 0.." + (vmm.length - 1) + ")" : takeOverRefusal());
      }
      makeCurrent(device);
      segment = vmm[device].adopt(fd, bytes);
      live.add(segment);
      return segment;
    } finally {
      if (segment == null) {
        Descriptors.closeQuietly(fd); // a number received from another process, which no Java object owns
      }
    }
  }

  /**
   * Unmaps the daemon's mapping, frees its address range and releases its handle, as {@link
   * #free} does: a VMM allocation is destroyed only once every handle and mapping is gone, and
   * the successor holds its own.
   */
  @Override
  public void relinquish(SegmentMemory segment) {
    if (!(segment instanceof VmmSegment)) {
      throw new UnsupportedOperationException(String.valueOf(takeOverRefusal()));
    }
    free(segment);
  }

  @Override
  public void zero(SegmentMemory segment, long offset, long length) {
    DeviceSegment cuda = (DeviceSegment) segment;
    makeCurrent(cuda.device());
    CudaCalls.check(cuMemsetD8(cuda.pointer().withByteOffset(offset), (byte) 0, length),
        "cuMemsetD8(" + length + ") on device " + cuda.device());
    // cuMemsetD8 is asynchronous to the host for device memory; the client must see zeros
    // on whatever stream it uses, so wait for completion before handing the block out.
    CudaCalls.check(JCudaDriver.cuCtxSynchronize(), "cuCtxSynchronize on device " + cuda.device());
  }

  @Override
  public HostBuffer allocateHost(long bytes) {
    makeCurrent(0); // portable pinned memory: any context will do
    return PinnedCopies.allocate(bytes);
  }

  @Override
  public void copyToHost(SegmentMemory segment, long offset, HostBuffer host, long hostOffset, long length) {
    makeCurrent(segment.device());
    PinnedCopies.toHost(segment, offset, host, hostOffset, length);
  }

  @Override
  public void copyFromHost(HostBuffer host, long hostOffset, SegmentMemory segment, long offset, long length) {
    makeCurrent(segment.device());
    PinnedCopies.fromHost(host, hostOffset, segment, offset, length);
  }

  @Override
  public boolean freshSegmentsAreZeroed() {
    return false; // cuMemAlloc and cuMemCreate memory is uninitialized
  }

  /** The VMM allocation granularity on a VMM device; 1 (any size) for legacy handles. */
  @Override
  public long segmentGranularity(int device) {
    return vmm[device] == null ? 1 : vmm[device].granularity();
  }

  /** True when any device uses VMM handles: their descriptors go out over the fd channel. */
  @Override
  public boolean passesDescriptors() {
    for (VmmAllocations v : vmm) {
      if (v != null) {
        return true;
      }
    }
    return false;
  }

  @Override
  public boolean supportsCompletionEvents() {
    return true;
  }

  @Override
  public CompletionEvent openEvent(int device, byte[] ipcEventHandle) {
    makeCurrent(device);
    CUevent event = new CUevent();
    int result = cuIpcOpenEventHandle(event, CudaHandles.eventHandle(ipcEventHandle));
    if (result != CUresult.CUDA_SUCCESS) {
      throw new InvalidEventHandleException("not openable on device " + device
          + " (" + CUresult.stringFor(result) + ")", "a handle from cuIpcGetEventHandle of an "
          + "event created with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING");
    }
    return new CompletionEvent() {
      private boolean closed;

      @Override
      public boolean isComplete() {
        makeCurrent(device);
        int status = cuEventQuery(event);
        if (status == CUresult.CUDA_ERROR_NOT_READY) {
          return false;
        }
        // Any other error (a sticky context error, an event whose exporter is gone) says
        // nothing about the client's kernels: the pool keeps the block out of reuse.
        CudaCalls.check(status, "cuEventQuery on device " + device);
        return true;
      }

      @Override
      public void close() {
        if (!closed) {
          closed = true;
          makeCurrent(device);
          cuEventDestroy(event);
        }
      }
    };
  }

  @Override
  protected void release() {
    int freed = 0;
    for (DeviceSegment segment : List.copyOf(live)) {
      free(segment);
      freed++;
    }
    for (int d = 0; d < handles.length; d++) {
      cuDevicePrimaryCtxRelease(handles[d]);
    }
    if (freed > 0) {
      log.info("CUDA backend freed {} segments still allocated at close", freed);
    }
  }
}
