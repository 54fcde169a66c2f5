package io.gpumemd.server.grpc;

import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import io.grpc.BindableService;
import io.grpc.ServerMethodDefinition;
import io.grpc.ServerServiceDefinition;
import io.grpc.ServiceDescriptor;
import io.grpc.protobuf.ProtoFileDescriptorSupplier;
import java.io.IOException;
import java.io.InputStream;
import java.util.HashMap;
import java.util.Map;

/**
 * Makes server reflection describe gpumemd's services with their {@code .proto} comments.
 *
 * <p>grpc-java's reflection serves the file descriptors embedded in the generated classes, and
 * protoc's Java generator strips source info (comments) from those. The build also writes a
 * descriptor set with source info ({@code gpumemd/v1/gpumemd.protoset}, from the proto module);
 * this class rebinds a service to a schema built from it, so {@code grpcurl describe} shows
 * operators what each rpc and field means. If the resource is missing the service is served
 * as generated. Immutable after loading; thread-safe.
 */
public final class DocumentedSchema {
  private static final String RESOURCE = "gpumemd/v1/gpumemd.protoset";
  private static final Map<String, FileDescriptor> FILES = load();

  private DocumentedSchema() {}

  private static Map<String, FileDescriptor> load() {
    Map<String, FileDescriptor> files = new HashMap<>();
    try (InputStream in = DocumentedSchema.class.getClassLoader().getResourceAsStream(RESOURCE)) {
      if (in == null) {
        return files;
      }
      for (FileDescriptorProto proto : FileDescriptorSet.parseFrom(in).getFileList()) {
        // protoc lists a file after the files it imports (the take-over protos import each other).
        FileDescriptor[] deps = new FileDescriptor[proto.getDependencyCount()];
        for (int i = 0; i < deps.length; i++) {
          deps[i] = files.get(proto.getDependency(i));
          if (deps[i] == null) {
            throw new IOException(proto.getName() + " imports " + proto.getDependency(i) + ", listed after it");
          }
        }
        files.put(proto.getName(), FileDescriptor.buildFrom(proto, deps));
      }
    } catch (IOException | DescriptorValidationException e) {
      throw new IllegalStateException("cannot load " + RESOURCE + ": " + e, e);
    }
    return files;
  }

  /** The service, described by the documented schema when one matches it. */
  public static ServerServiceDefinition bind(BindableService service) {
    ServerServiceDefinition generated = service.bindService();
    ServiceDescriptor descriptor = generated.getServiceDescriptor();
    if (!(descriptor.getSchemaDescriptor() instanceof ProtoFileDescriptorSupplier supplier)) {
      return generated;
    }
    FileDescriptor documented = FILES.get(supplier.getFileDescriptor().getName());
    if (documented == null || documented.findServiceByName(descriptor.getName().substring(
        descriptor.getName().lastIndexOf('.') + 1)) == null) {
      return generated;
    }
    ServiceDescriptor.Builder rebuilt = ServiceDescriptor.newBuilder(descriptor.getName())
        .setSchemaDescriptor((ProtoFileDescriptorSupplier) () -> documented);
    descriptor.getMethods().forEach(rebuilt::addMethod);
    ServerServiceDefinition.Builder out = ServerServiceDefinition.builder(rebuilt.build());
    for (ServerMethodDefinition<?, ?> method : generated.getMethods()) {
      out.addMethod(method);
    }
    return out.build();
  }
}
