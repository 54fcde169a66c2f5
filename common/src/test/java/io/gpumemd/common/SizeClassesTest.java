package io.gpumemd.common;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The size-class table, row by row, as the daemon's pools and the client cache read it. */
class SizeClassesTest {
  private static final long KiB = 1 << 10;
  private static final long MiB = 1 << 20;

  @Test
  void roundUp_toMultiplesOf512() {
    assertEquals(512, SizeClasses.roundUp(1));
    assertEquals(512, SizeClasses.roundUp(512));
    assertEquals(1024, SizeClasses.roundUp(513));
    assertEquals(5 * KiB, SizeClasses.roundUp(5000));
  }

  @Test
  void smallRequests_shareTwoMiBSegments_largeOnesGetTheirOwnRoundedToTwoMiB() {
    assertTrue(SizeClasses.isSmall(MiB));
    assertFalse(SizeClasses.isSmall(MiB + 512));
    assertEquals(2 * MiB, SizeClasses.segmentBytes(512));
    assertEquals(2 * MiB, SizeClasses.segmentBytes(MiB));
    assertEquals(2 * MiB, SizeClasses.segmentBytes(MiB + 512));
    assertEquals(6 * MiB, SizeClasses.segmentBytes(5 * MiB));
  }

  @Test
  void split_whenAtLeast512BRemainOfASmallBlock_andMoreThan1MiBOfALargeOne() {
    assertTrue(SizeClasses.shouldSplit(4 * KiB, 3 * KiB + 512));
    assertFalse(SizeClasses.shouldSplit(4 * KiB, 4 * KiB));
    assertFalse(SizeClasses.shouldSplit(5 * MiB, 4 * MiB), "1 MiB left of a large block stays with it");
    assertTrue(SizeClasses.shouldSplit(5 * MiB + 512, 4 * MiB));
  }

  @Test
  void largestFit_isOneSmallSegment_orTheRequestPlusTheOversizeRule() {
    assertEquals(2 * MiB, SizeClasses.largestFit(4 * KiB, SizeClasses.DEFAULT_MAX_OVERSIZE));
    assertEquals(2 * MiB, SizeClasses.largestFit(MiB, 0), "the oversize rule is for large requests only");
    assertEquals(30 * MiB, SizeClasses.largestFit(10 * MiB, SizeClasses.DEFAULT_MAX_OVERSIZE));
    assertEquals(14 * MiB, SizeClasses.largestFit(10 * MiB, 4 * MiB));
    assertEquals(10 * MiB, SizeClasses.largestFit(10 * MiB, 0));
  }
}
