package io.gpumemd.server.pool;

import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.BackendOutOfMemoryException;
import io.gpumemd.server.backend.CompletionEvent;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Queue;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * A {@link MemoryBackend} for pool unit tests and the pool benchmark. It holds no device memory:
 * a segment is a record with a serial number and, only when asked for ({@code keepBytes}), a
 * byte array so that tests can check what zeroing wrote.
 *
 * <p>What it offers tests:
 *
 * <ul>
 *   <li>counters of allocations, frees and zero calls, and the set of live segments;
 *   <li>a capacity per device: an allocation past it throws {@link BackendOutOfMemoryException},
 *       as {@code cuMemAlloc} does on a full GPU;
 *   <li>scripted failures: {@link #failNextAllocations} makes the next allocations throw what
 *       the test gives (an OOM, a plain {@link BackendException}, ...);
 *   <li>a record of every {@link #zero} call ({@link #zeroCalls()});
 *   <li>fake completion events ({@link #newEvent()}) that the test completes by hand;
 *   <li>hooks run inside {@link #allocate} and {@link #free}, to interleave pool calls at the
 *       points where the pool runs outside its lock;
 *   <li>{@link #checkEveryCall}: a check run on every allocate, free and zero;
 *   <li>{@link #errors()}: misuse the pool must never commit (double free, zeroing a freed
 *       segment or past its end); recorded rather than thrown, because the pool calls
 *       {@code free} from places where an exception would hide the first failure.
 * </ul>
 *
 * <p>Thread-safe: counters are atomic, collections concurrent. {@code freshSegmentsAreZeroed}
 * is {@code true} by default (host semantics) and may be switched off (CUDA semantics): fresh
 * segments kept with bytes then hold {@link #GARBAGE}, as if another owner had written them.
 */
public final class InMemoryBackend implements MemoryBackend {
  /** Segments larger than this never get a byte array, even with {@code keepBytes}. */
  private static final long MAX_KEPT_SEGMENT = 64L << 20;
  /** What a fresh segment holds when fresh segments are not zeroed: someone else's bytes. */
  public static final byte GARBAGE = (byte) 0xA5;

  private final List<DeviceInfo> devices;
  private final long capacityBytes;
  private final boolean keepBytes;
  private final AtomicLongArray usedBytes;
  private final AtomicLong serials = new AtomicLong();
  private final AtomicLong allocs = new AtomicLong();
  private final AtomicLong frees = new AtomicLong();
  private final AtomicLong zeroes = new AtomicLong();
  private final AtomicLong zeroedBytes = new AtomicLong();
  private final Set<FakeSegment> live = ConcurrentHashMap.newKeySet();
  private final Queue<RuntimeException> scriptedFailures = new ConcurrentLinkedQueue<>();
  private final List<ZeroCall> zeroCalls = new CopyOnWriteArrayList<>();
  private final List<String> errors = new CopyOnWriteArrayList<>();
  private final List<FakeEvent> events = new CopyOnWriteArrayList<>();
  private volatile boolean freshZeroed = true;
  private volatile long granularity = 1;
  private volatile boolean recordZeroCalls = true;
  private volatile RuntimeException zeroFailure;
  private volatile Supplier<String> callCheck;
  private volatile Runnable allocateHook;
  private volatile Consumer<SegmentMemory> freeHook;
  private volatile boolean closed;

  /** One device, no byte arrays. */
  public InMemoryBackend(long capacityBytes) {
    this(1, capacityBytes, false);
  }

  /**
   * @param deviceCount simulated devices, ordinals 0..n-1
   * @param capacityBytes capacity of each device
   * @param keepBytes give every segment (up to 64 MiB) a byte array that {@link #zero} clears
   */
  public InMemoryBackend(int deviceCount, long capacityBytes, boolean keepBytes) {
    List<DeviceInfo> infos = new ArrayList<>();
    for (int d = 0; d < deviceCount; d++) {
      infos.add(new DeviceInfo(d, "in-memory", "MEM-" + d, "memory", capacityBytes, capacityBytes));
    }
    this.devices = List.copyOf(infos);
    this.capacityBytes = capacityBytes;
    this.keepBytes = keepBytes;
    this.usedBytes = new AtomicLongArray(deviceCount);
  }

  /** A segment of this backend. */
  public static final class FakeSegment implements SegmentMemory {
    private final int device;
    private final long bytes;
    private final long serial;
    private final SegmentOwner owner;
    /** Contents, or null when the backend keeps no bytes. Reads and writes are the test's. */
    final byte[] data;
    final AtomicBoolean freed = new AtomicBoolean();

    FakeSegment(int device, long bytes, long serial, SegmentOwner owner, byte[] data) {
      this.device = device;
      this.bytes = bytes;
      this.serial = serial;
      this.owner = owner;
      this.data = data;
    }

    @Override
    public int device() {
      return device;
    }

    @Override
    public long bytes() {
      return bytes;
    }

    /** Allocation number, from 1, in the order the backend handed segments out. */
    public long serial() {
      return serial;
    }

    /** The owner the pool allocated it for. */
    public SegmentOwner owner() {
      return owner;
    }

    @Override
    public IpcHandle handle() {
      return new IpcHandle.HostShm("mem://dev" + device + "/seg-" + serial);
    }

    @Override
    public String toString() {
      return "FakeSegment[" + serial + ", " + bytes + " bytes on device " + device + "]";
    }
  }

  /** One {@link #zero} call. */
  public record ZeroCall(FakeSegment segment, long offset, long length) {}

  /** A completion event the test completes by hand; counts queries and closes. */
  public static final class FakeEvent implements CompletionEvent {
    private volatile boolean complete;
    private volatile RuntimeException queryFailure;
    private final AtomicLong queries = new AtomicLong();
    private final AtomicLong closes = new AtomicLong();

    /** From now on the event reports completion. */
    public void complete() {
      complete = true;
    }

    /** From now on a query throws this (as a CUDA error would; the pool must never take it for completion). */
    public void failQueriesWith(RuntimeException failure) {
      queryFailure = failure;
    }

    @Override
    public boolean isComplete() {
      queries.incrementAndGet();
      RuntimeException failure = queryFailure;
      if (failure != null) {
        throw failure;
      }
      return complete;
    }

    @Override
    public void close() {
      closes.incrementAndGet();
    }

    public long queries() {
      return queries.get();
    }

    public boolean closed() {
      return closes.get() > 0;
    }
  }

  // ------------------------------------------------------------------------ test controls

  /** Makes the next allocations throw these, in order, one each. */
  public InMemoryBackend failNextAllocations(RuntimeException... failures) {
    scriptedFailures.addAll(Arrays.asList(failures));
    return this;
  }

  /**
   * Makes every allocation fail as a full device would until {@link #clearScriptedFailures}:
   * longer than the pool's wait for a device whose count is only transiently ahead.
   */
  public InMemoryBackend staysFull(String message) {
    for (int i = 0; i < 10_000; i++) {
      scriptedFailures.add(new BackendOutOfMemoryException(message));
    }
    return this;
  }

  /** Forgets the scripted failures not used yet. */
  public InMemoryBackend clearScriptedFailures() {
    scriptedFailures.clear();
    return this;
  }

  /** Makes the next allocation fail as a full device would. */
  public InMemoryBackend failNextAllocationWithOom() {
    return failNextAllocations(new BackendOutOfMemoryException("scripted: device full"));
  }

  /** Makes the next {@link #zero} call throw {@code failure}. */
  public InMemoryBackend failNextZero(RuntimeException failure) {
    this.zeroFailure = failure;
    return this;
  }

  /** Whether fresh segments read as zeros (host: true, CUDA: false). */
  public InMemoryBackend freshSegmentsZeroed(boolean zeroed) {
    this.freshZeroed = zeroed;
    return this;
  }

  /**
   * Makes every segment a multiple of {@code bytes}, as CUDA VMM's allocation granularity does;
   * an allocation of any other size fails and is recorded in {@link #errors()}. Set it before
   * the pool is made: the pool reads it once.
   */
  public InMemoryBackend withSegmentGranularity(long bytes) {
    this.granularity = bytes;
    return this;
  }

  /** Turns off the record of zero calls (the benchmark would otherwise grow it forever). */
  public InMemoryBackend recordZeroCalls(boolean record) {
    this.recordZeroCalls = record;
    return this;
  }

  /**
   * Runs at the start of every allocate, free and zero; a non-null answer is recorded in {@link
   * #errors()}. The pool tests use it to check that backend calls happen outside the pool lock.
   */
  public InMemoryBackend checkEveryCall(Supplier<String> check) {
    this.callCheck = check;
    return this;
  }

  private void checkCall(String call) {
    Supplier<String> check = callCheck;
    String problem = check == null ? null : check.get();
    if (problem != null) {
      errors.add(call + ": " + problem);
    }
  }

  /** Runs inside {@link #allocate}, before the segment is created; null for none. */
  public InMemoryBackend onAllocate(Runnable hook) {
    this.allocateHook = hook;
    return this;
  }

  /** Runs inside {@link #free} with the segment being freed, before it is gone; null for none. */
  public InMemoryBackend onFree(Consumer<SegmentMemory> hook) {
    this.freeHook = hook;
    return this;
  }

  /** A fresh incomplete event, as {@link #openEvent} would return. */
  public FakeEvent newEvent() {
    FakeEvent event = new FakeEvent();
    events.add(event);
    return event;
  }

  // ------------------------------------------------------------------------ observations

  public long allocs() {
    return allocs.get();
  }

  public long frees() {
    return frees.get();
  }

  public long zeroes() {
    return zeroes.get();
  }

  public long zeroedBytes() {
    return zeroedBytes.get();
  }

  public List<ZeroCall> zeroCalls() {
    return List.copyOf(zeroCalls);
  }

  public int liveSegments() {
    return live.size();
  }

  public long liveBytes() {
    return live.stream().mapToLong(FakeSegment::bytes).sum();
  }

  public long usedBytes(int device) {
    return usedBytes.get(device);
  }

  public List<FakeEvent> events() {
    return List.copyOf(events);
  }

  /** Misuse seen so far; empty when the pool behaved. */
  public List<String> errors() {
    return List.copyOf(errors);
  }

  public boolean isLive(SegmentMemory segment) {
    return live.contains((FakeSegment) segment);
  }

  /** Writes {@code value} over a range of a segment kept with bytes. */
  public static void fill(SegmentMemory segment, long offset, long length, byte value) {
    Arrays.fill(dataOf(segment), Math.toIntExact(offset), Math.toIntExact(offset + length), value);
  }

  /** True when every byte of the range is zero. */
  public static boolean isZero(SegmentMemory segment, long offset, long length) {
    byte[] data = dataOf(segment);
    for (int i = Math.toIntExact(offset); i < offset + length; i++) {
      if (data[i] != 0) {
        return false;
      }
    }
    return true;
  }

  private static byte[] dataOf(SegmentMemory segment) {
    byte[] data = ((FakeSegment) segment).data;
    if (data == null) {
      throw new IllegalStateException(segment + " keeps no bytes (construct with keepBytes)");
    }
    return data;
  }

  // ------------------------------------------------------------------------ MemoryBackend

  @Override
  public String name() {
    return "memory";
  }

  @Override
  public List<DeviceInfo> devices() {
    return devices;
  }

  @Override
  public SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
    checkCall("allocate");
    if (closed) {
      throw new BackendException("in-memory backend is closed");
    }
    if (bytes <= 0) {
      errors.add("allocate of " + bytes + " bytes");
      throw new BackendException("allocate: " + bytes + " (expected: > 0)");
    }
    if (bytes % granularity != 0) {
      // cuMemCreate refuses such a size (CUDA_ERROR_INVALID_VALUE): the pool must round.
      errors.add("allocate of " + bytes + " bytes, not a multiple of the granularity " + granularity);
      throw new BackendException("allocate: " + bytes + " (expected: a multiple of " + granularity + ")");
    }
    Runnable hook = allocateHook;
    if (hook != null) {
      hook.run();
    }
    RuntimeException failure = scriptedFailures.poll();
    if (failure != null) {
      throw failure;
    }
    long used = usedBytes.addAndGet(device, bytes);
    if (used > capacityBytes) {
      usedBytes.addAndGet(device, -bytes);
      throw new BackendOutOfMemoryException("in-memory device " + device + ": " + bytes
          + " bytes requested, " + (used - bytes) + " of " + capacityBytes + " in use");
    }
    byte[] data = keepBytes && bytes <= MAX_KEPT_SEGMENT ? new byte[(int) bytes] : null;
    if (data != null && !freshZeroed) {
      Arrays.fill(data, GARBAGE);
    }
    FakeSegment segment = new FakeSegment(device, bytes, serials.incrementAndGet(), owner, data);
    live.add(segment);
    allocs.incrementAndGet();
    return segment;
  }

  @Override
  public void free(SegmentMemory segment) {
    checkCall("free");
    FakeSegment fake = (FakeSegment) segment;
    Consumer<SegmentMemory> hook = freeHook;
    if (hook != null) {
      hook.accept(segment);
    }
    if (!fake.freed.compareAndSet(false, true) || !live.remove(fake)) {
      errors.add("double free of " + fake);
      return;
    }
    usedBytes.addAndGet(fake.device(), -fake.bytes());
    frees.incrementAndGet();
  }

  @Override
  public void zero(SegmentMemory segment, long offset, long length) {
    checkCall("zero");
    FakeSegment fake = (FakeSegment) segment;
    if (fake.freed.get()) {
      errors.add("zero of freed " + fake);
    }
    if (offset < 0 || length <= 0 || offset + length > fake.bytes()) {
      errors.add("zero [" + offset + ", +" + length + ") outside " + fake);
      throw new BackendException("zero out of bounds");
    }
    RuntimeException failure = zeroFailure;
    if (failure != null) {
      zeroFailure = null;
      throw failure;
    }
    if (fake.data != null) {
      Arrays.fill(fake.data, (int) offset, (int) (offset + length), (byte) 0);
    }
    zeroes.incrementAndGet();
    zeroedBytes.addAndGet(length);
    if (recordZeroCalls) {
      zeroCalls.add(new ZeroCall(fake, offset, length));
    }
  }

  @Override
  public long segmentGranularity(int device) {
    return granularity;
  }

  @Override
  public boolean freshSegmentsAreZeroed() {
    return freshZeroed;
  }

  @Override
  public boolean supportsCompletionEvents() {
    return true;
  }

  @Override
  public CompletionEvent openEvent(int device, byte[] ipcEventHandle) {
    return newEvent();
  }

  /** Frees whatever is still live (as the real backends do). Idempotent. */
  @Override
  public void close() {
    closed = true;
    for (FakeSegment segment : List.copyOf(live)) {
      if (segment.freed.compareAndSet(false, true) && live.remove(segment)) {
        usedBytes.addAndGet(segment.device(), -segment.bytes());
        frees.incrementAndGet();
      }
    }
  }
}
