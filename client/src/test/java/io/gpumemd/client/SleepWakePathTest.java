package io.gpumemd.client;

/**
 * {@link SleepWakeContract} with host segments passed as shared-memory files' paths: a wake maps
 * the new segment's file.
 */
class SleepWakePathTest extends SleepWakeContract {
  @Override
  String hostSegments() {
    return "path";
  }
}
