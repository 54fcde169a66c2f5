package io.gpumemd.common.cuda;

import com.sun.jna.Function;
import com.sun.jna.Memory;
import com.sun.jna.NativeLibrary;

/**
 * The CUDA driver's virtual memory management calls, bound through JNA to {@code libcuda.so.1}
 * (the library JCuda's natives load, so contexts made current through JCuda are current here
 * too) with plain integers for handles and addresses.
 *
 * <p>Why not JCuda: its 12.0.0 natives (and its source today) marshal three of these wrongly.
 * {@code cuMemExportToShareableHandle} always passes NULL as the output pointer, so no
 * descriptor can be exported; {@code cuMemSetAccess} reads the location's fields from the access
 * descriptor instead of its {@code location}, so the driver gets the access flags as the
 * location type; and {@code CUmemAllocationProp} (for {@code cuMemCreate} and {@code
 * cuMemGetAllocationGranularity}) is copied into an uninitialised struct whose allocation flags
 * are read from the wrong object, where the driver expects zeros. The structs are laid out here
 * as {@code cuda.h} declares them for 64-bit Linux, zeroed, as {@code
 * shared/gpu/vmm_reference.py} does (checked on an H100).
 *
 * <p>Every method returns the driver's result code ({@code CUresult}) and leaves checking it to
 * the caller, which knows what to name; the calling thread must have the device's context
 * current. Stateless and thread-safe; the library is loaded on first use, so a host-only process
 * never loads it.
 */
public final class VmmDriver {
  /** {@code CU_MEM_ACCESS_FLAGS_PROT_READ}. */
  public static final int PROT_READ = 1;
  /** {@code CU_MEM_ACCESS_FLAGS_PROT_READWRITE}. */
  public static final int PROT_READWRITE = 3;

  private static final int LOCATION_TYPE_DEVICE = 1;
  private static final int ALLOCATION_TYPE_PINNED = 1;
  private static final int HANDLE_TYPE_POSIX_FD = 1;
  private static final int GRANULARITY_MINIMUM = 0;
  /** {@code sizeof(CUmemAllocationProp)} on 64-bit Linux. */
  private static final int PROP_BYTES = 32;
  /** {@code sizeof(CUmemAccessDesc)}. */
  private static final int ACCESS_DESC_BYTES = 12;

  private VmmDriver() {}

  /** {@code cuMemGetAllocationGranularity}, minimum, for pinned device memory exportable as an fd. */
  public static int minimumGranularity(int device, long[] granularity) {
    try (Memory prop = properties(device); Memory out = new Memory(Long.BYTES)) {
      int result = Calls.GRANULARITY.invokeInt(new Object[] {out, prop, GRANULARITY_MINIMUM});
      granularity[0] = out.getLong(0);
      return result;
    }
  }

  /** {@code cuMemCreate} of {@code bytes} on a device, exportable as a POSIX descriptor. */
  public static int create(int device, long bytes, long[] handle) {
    try (Memory prop = properties(device); Memory out = new Memory(Long.BYTES)) {
      out.setLong(0, 0);
      int result = Calls.CREATE.invokeInt(new Object[] {out, bytes, prop, 0L});
      handle[0] = out.getLong(0);
      return result;
    }
  }

  /** {@code cuMemAddressReserve} of {@code bytes}, any address, default alignment. */
  public static int reserve(long bytes, long[] address) {
    try (Memory out = new Memory(Long.BYTES)) {
      out.setLong(0, 0);
      int result = Calls.RESERVE.invokeInt(new Object[] {out, bytes, 0L, 0L, 0L});
      address[0] = out.getLong(0);
      return result;
    }
  }

  /** {@code cuMemMap} of a whole allocation at {@code address}. */
  public static int map(long address, long bytes, long handle) {
    return Calls.MAP.invokeInt(new Object[] {address, bytes, 0L, handle, 0L});
  }

  /** {@code cuMemSetAccess(address, bytes, &desc, 1)} for one device. */
  public static int setAccess(long address, long bytes, int device, int flags) {
    try (Memory desc = new Memory(ACCESS_DESC_BYTES)) {
      desc.setInt(0, LOCATION_TYPE_DEVICE);
      desc.setInt(4, device);
      desc.setInt(8, flags);
      return Calls.SET_ACCESS.invokeInt(new Object[] {address, bytes, desc, 1L});
    }
  }

  /**
   * {@code cuMemSetAccess(address, bytes, desc, n)}: the same {@code flags} for each of {@code
   * devices}, in one call (the driver applies all or none).
   */
  public static int setAccess(long address, long bytes, int[] devices, int flags) {
    try (Memory desc = new Memory((long) ACCESS_DESC_BYTES * devices.length)) {
      for (int i = 0; i < devices.length; i++) {
        desc.setInt((long) i * ACCESS_DESC_BYTES, LOCATION_TYPE_DEVICE);
        desc.setInt((long) i * ACCESS_DESC_BYTES + 4, devices[i]);
        desc.setInt((long) i * ACCESS_DESC_BYTES + 8, flags);
      }
      return Calls.SET_ACCESS.invokeInt(new Object[] {address, bytes, desc, (long) devices.length});
    }
  }

  /**
   * What {@link #mapWhole} did: the address of the mapping, or the call that failed and its
   * result (everything it had done undone).
   */
  public record Mapped(long address, String failedCall, int result) {
    /** Whether the allocation is mapped and accessible at {@link #address}. */
    public boolean ok() {
      return failedCall == null;
    }
  }

  /**
   * The one reserve, map and set-access of a whole allocation, and its undo: reserves {@code
   * bytes} of address space, maps {@code allocation} there and grants {@code flags} to each of
   * {@code devices}. On a failure it unmaps and frees what it did and says which call failed;
   * the allocation handle stays the caller's, to release.
   */
  public static Mapped mapWhole(long allocation, long bytes, int[] devices, int flags) {
    long[] address = new long[1];
    int result = reserve(bytes, address);
    if (result != 0) {
      return new Mapped(0, "cuMemAddressReserve", result);
    }
    Mapped mapped = mapAt(address[0], allocation, bytes, devices, flags);
    if (!mapped.ok()) {
      addressFree(address[0], bytes);
    }
    return mapped;
  }

  /**
   * Maps a whole allocation at {@code address}, a reserved range with nothing mapped in it (the
   * driver maps only into an unmapped reservation), and grants {@code flags} to each of {@code
   * devices}: the map of {@link #mapWhole}, and a refill of a range kept while its memory was
   * away. On a failure it unmaps what it mapped (the reservation stays) and says which call failed.
   */
  public static Mapped mapAt(long address, long allocation, long bytes, int[] devices, int flags) {
    int result = map(address, bytes, allocation);
    if (result != 0) {
      return new Mapped(0, "cuMemMap", result);
    }
    result = setAccess(address, bytes, devices, flags);
    if (result != 0) {
      unmap(address, bytes);
      return new Mapped(0, "cuMemSetAccess", result);
    }
    return new Mapped(address, null, 0);
  }

  /** {@code cuMemUnmap}. */
  public static int unmap(long address, long bytes) {
    return Calls.UNMAP.invokeInt(new Object[] {address, bytes});
  }

  /** {@code cuMemAddressFree}. */
  public static int addressFree(long address, long bytes) {
    return Calls.ADDRESS_FREE.invokeInt(new Object[] {address, bytes});
  }

  /** {@code cuMemRelease}. */
  public static int release(long handle) {
    return Calls.RELEASE.invokeInt(new Object[] {handle});
  }

  /** {@code cuMemExportToShareableHandle}: a new POSIX descriptor of the allocation in {@code fd[0]}. */
  public static int exportDescriptor(long handle, int[] fd) {
    try (Memory out = new Memory(Integer.BYTES)) {
      out.setInt(0, -1);
      int result = Calls.EXPORT.invokeInt(new Object[] {out, handle, HANDLE_TYPE_POSIX_FD, 0L});
      fd[0] = out.getInt(0);
      return result;
    }
  }

  /**
   * {@code cuMemImportFromShareableHandle}: a handle in {@code handle[0]} of the allocation a
   * POSIX descriptor exported by another process names. The descriptor stays the caller's to
   * close; the handle keeps the allocation alive ({@link #release} it).
   */
  public static int importDescriptor(int fd, long[] handle) {
    try (Memory out = new Memory(Long.BYTES)) {
      out.setLong(0, 0);
      // The OS handle is passed as a void* whose value is the descriptor number.
      int result = Calls.IMPORT.invokeInt(new Object[] {out, (long) fd, HANDLE_TYPE_POSIX_FD});
      handle[0] = out.getLong(0);
      return result;
    }
  }

  /** A zeroed {@code CUmemAllocationProp}: pinned, on the device, POSIX fd handle type. */
  private static Memory properties(int device) {
    Memory prop = new Memory(PROP_BYTES);
    prop.clear();
    prop.setInt(0, ALLOCATION_TYPE_PINNED);
    prop.setInt(4, HANDLE_TYPE_POSIX_FD);
    prop.setInt(8, LOCATION_TYPE_DEVICE);
    prop.setInt(12, device);
    return prop;
  }

  /** The entry points, looked up on first use. */
  private static final class Calls {
    private static final NativeLibrary CUDA = NativeLibrary.getInstance("libcuda.so.1");
    static final Function GRANULARITY = CUDA.getFunction("cuMemGetAllocationGranularity");
    static final Function CREATE = CUDA.getFunction("cuMemCreate");
    static final Function RESERVE = CUDA.getFunction("cuMemAddressReserve");
    static final Function MAP = CUDA.getFunction("cuMemMap");
    static final Function SET_ACCESS = CUDA.getFunction("cuMemSetAccess");
    static final Function UNMAP = CUDA.getFunction("cuMemUnmap");
    static final Function ADDRESS_FREE = CUDA.getFunction("cuMemAddressFree");
    static final Function RELEASE = CUDA.getFunction("cuMemRelease");
    static final Function EXPORT = CUDA.getFunction("cuMemExportToShareableHandle");
    static final Function IMPORT = CUDA.getFunction("cuMemImportFromShareableHandle");
  }
}
