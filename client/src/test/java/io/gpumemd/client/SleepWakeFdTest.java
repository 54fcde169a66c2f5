package io.gpumemd.client;

/**
 * {@link SleepWakeContract} with host segments passed as file descriptors: a wake fetches the new
 * segment's descriptor from the fd channel.
 */
class SleepWakeFdTest extends SleepWakeContract {
  @Override
  String hostSegments() {
    return "fd";
  }
}
