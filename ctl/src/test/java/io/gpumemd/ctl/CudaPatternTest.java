package io.gpumemd.ctl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;

import java.nio.ByteBuffer;
import org.junit.jupiter.api.Test;

/**
 * The CUDA worker's pattern, built a word at a time for one bulk copy, is byte for byte the
 * pattern the host worker writes into a mapped buffer (no GPU needed to check that).
 */
class CudaPatternTest {
  @Test
  void bulkPattern_equalsTheHostWorkersBytes_includingAnUnalignedTail() {
    for (int size : new int[] {8, 4096, 4096 + 5, 1 << 20}) {
      ByteBuffer host = ByteBuffer.allocate(size);
      Worker.writePattern(host, 42);
      assertArrayEquals(host.array(), CudaPattern.pattern(42, 0, size), "size " + size);
    }
  }

  @Test
  void bulkPattern_atAnOffset_continuesTheSameSequence() {
    ByteBuffer host = ByteBuffer.allocate(3 << 20);
    Worker.writePattern(host, 7);
    byte[] expected = java.util.Arrays.copyOfRange(host.array(), 1 << 20, 2 << 20);
    assertArrayEquals(expected, CudaPattern.pattern(7, 1 << 20, 1 << 20));
  }
}
