package io.gpumemd.it.deploy;

import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.Descriptors.MethodDescriptor;
import com.google.protobuf.Descriptors.ServiceDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.util.JsonFormat;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.protobuf.ProtoUtils;
import io.grpc.reflection.v1.ServerReflectionGrpc;
import io.grpc.reflection.v1.ServerReflectionRequest;
import io.grpc.reflection.v1.ServerReflectionResponse;
import io.grpc.reflection.v1.ServiceResponse;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * What grpcurl does, done in Java for tests: every piece of schema comes from the server's
 * reflection service (grpc.reflection.v1), nothing from the generated classes. Lists services,
 * fetches and links file descriptors, and makes unary calls with JSON in and JSON out through
 * {@link DynamicMessage}.
 *
 * <p>{@link #run} understands the grpcurl command lines deploy/README.md shows:
 * {@code grpcurl [-plaintext] [-unix] [-H 'NAME: VALUE'] [-d JSON] ADDRESS (list [SERVICE] | describe SYMBOL |
 * SERVICE/METHOD)}; the address is replaced by this object's channel. Not thread-safe.
 */
final class ReflectionGrpcurl {
  private final Channel channel;
  /** File descriptors the server sent, by file name; linked on demand. */
  private final Map<String, FileDescriptorProto> protos = new HashMap<>();
  private final Map<String, FileDescriptor> linked = new HashMap<>();

  ReflectionGrpcurl(Channel channel) {
    this.channel = channel;
  }

  /** {@code grpcurl ADDRESS list}: the services the server reflects. */
  List<String> listServices() {
    ServerReflectionResponse response = reflect(ServerReflectionRequest.newBuilder().setListServices("").build());
    return response.getListServicesResponse().getServiceList().stream().map(ServiceResponse::getName).toList();
  }

  /** The linked file that defines {@code symbol} (a service, message or method). */
  FileDescriptor fileContaining(String symbol) {
    ServerReflectionResponse response = reflect(ServerReflectionRequest.newBuilder()
        .setFileContainingSymbol(symbol).build());
    FileDescriptorProto first = remember(response);
    return link(first.getName());
  }

  /** The raw descriptor the server sent for the file that defines {@code symbol}. */
  FileDescriptorProto rawFileContaining(String symbol) {
    return protos.get(fileContaining(symbol).getName());
  }

  ServiceDescriptor service(String name) {
    ServiceDescriptor service = fileContaining(name).findServiceByName(simpleName(name));
    if (service == null) {
      throw new AssertionError("not a service: " + name);
    }
    return service;
  }

  Descriptor message(String name) {
    Descriptor message = fileContaining(name).findMessageTypeByName(simpleName(name));
    if (message == null) {
      throw new AssertionError("not a message: " + name);
    }
    return message;
  }

  /** {@code grpcurl -d JSON ADDRESS service/method}: a unary call, JSON in, JSON out. */
  String call(String fullMethod, String jsonRequest) {
    int slash = fullMethod.lastIndexOf('/');
    if (slash <= 0) {
      throw new IllegalArgumentException("method: " + fullMethod + " (expected: package.Service/Method)");
    }
    ServiceDescriptor service = service(fullMethod.substring(0, slash));
    MethodDescriptor method = service.findMethodByName(fullMethod.substring(slash + 1));
    if (method == null) {
      throw new AssertionError("no method " + fullMethod);
    }
    if (method.isClientStreaming() || method.isServerStreaming()) {
      throw new IllegalArgumentException("only unary calls: " + fullMethod);
    }
    DynamicMessage.Builder request = DynamicMessage.newBuilder(method.getInputType());
    try {
      JsonFormat.parser().merge(jsonRequest, request);
      io.grpc.MethodDescriptor<DynamicMessage, DynamicMessage> grpcMethod =
          io.grpc.MethodDescriptor.<DynamicMessage, DynamicMessage>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(io.grpc.MethodDescriptor.generateFullMethodName(service.getFullName(), method.getName()))
              .setRequestMarshaller(ProtoUtils.marshaller(DynamicMessage.getDefaultInstance(method.getInputType())))
              .setResponseMarshaller(ProtoUtils.marshaller(DynamicMessage.getDefaultInstance(method.getOutputType())))
              .build();
      DynamicMessage response = ClientCalls.blockingUnaryCall(channel, grpcMethod,
          CallOptions.DEFAULT.withDeadlineAfter(10, TimeUnit.SECONDS), request.build());
      return JsonFormat.printer().print(response);
    } catch (InvalidProtocolBufferException e) {
      throw new AssertionError("JSON for " + fullMethod + ": " + e.getMessage(), e);
    }
  }

  /**
   * Runs one grpcurl command line (already split into words, {@code grpcurl} first) against
   * this channel and returns what grpcurl would print: service or method names one a line,
   * a descriptor in protobuf text form, or the JSON response.
   */
  String run(List<String> words) {
    if (words.isEmpty() || !words.get(0).equals("grpcurl")) {
      throw new IllegalArgumentException("not a grpcurl command: " + words);
    }
    String data = "{}";
    List<String> positional = new ArrayList<>();
    io.grpc.Metadata headers = new io.grpc.Metadata();
    for (int i = 1; i < words.size(); i++) {
      String w = words.get(i);
      switch (w) {
        case "-plaintext", "-unix" -> { }
        case "-d" -> data = words.get(++i);
        case "-H" -> {
          String[] header = words.get(++i).split(":", 2);
          headers.put(io.grpc.Metadata.Key.of(header[0].trim(), io.grpc.Metadata.ASCII_STRING_MARSHALLER), header[1].trim());
        }
        default -> {
          if (w.startsWith("-")) {
            throw new IllegalArgumentException("grpcurl flag this test does not know: " + w);
          }
          positional.add(w);
        }
      }
    }
    if (positional.size() < 2) {
      throw new IllegalArgumentException("expected ADDRESS and a verb: " + words);
    }
    if (!headers.keys().isEmpty()) {
      // grpcurl -H: the same command on a channel that sends the headers with every call
      List<String> without = new ArrayList<>(words);
      for (int i = without.indexOf("-H"); i >= 0; i = without.indexOf("-H")) {
        without.remove(i + 1);
        without.remove(i);
      }
      return new ReflectionGrpcurl(io.grpc.ClientInterceptors.intercept(channel,
          io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(headers))).run(without);
    }
    String verb = positional.get(1);
    List<String> rest = positional.subList(2, positional.size());
    if (verb.equals("list")) {
      if (rest.isEmpty()) {
        return String.join("\n", listServices());
      }
      return String.join("\n", service(rest.get(0)).getMethods().stream().map(MethodDescriptor::getFullName).toList());
    }
    if (verb.equals("describe")) {
      String symbol = rest.get(0);
      FileDescriptor file = fileContaining(symbol);
      ServiceDescriptor service = file.findServiceByName(simpleName(symbol));
      return service != null ? service.toProto().toString() : message(symbol).toProto().toString();
    }
    if (!rest.isEmpty()) {
      throw new IllegalArgumentException("unexpected arguments after " + verb + ": " + rest);
    }
    return call(verb, data);
  }

  private static String simpleName(String fullName) {
    return fullName.substring(fullName.lastIndexOf('.') + 1);
  }

  private FileDescriptorProto remember(ServerReflectionResponse response) {
    if (response.hasErrorResponse()) {
      throw new AssertionError("reflection error " + response.getErrorResponse().getErrorCode() + ": "
          + response.getErrorResponse().getErrorMessage());
    }
    FileDescriptorProto first = null;
    for (var bytes : response.getFileDescriptorResponse().getFileDescriptorProtoList()) {
      try {
        FileDescriptorProto proto = FileDescriptorProto.parseFrom(bytes);
        protos.putIfAbsent(proto.getName(), proto);
        if (first == null) {
          first = proto;
        }
      } catch (InvalidProtocolBufferException e) {
        throw new AssertionError("unparseable file descriptor from reflection", e);
      }
    }
    if (first == null) {
      throw new AssertionError("reflection sent no file descriptor");
    }
    return first;
  }

  /** Links a file with its dependencies, asking the server for any it has not sent yet. */
  private FileDescriptor link(String fileName) {
    FileDescriptor done = linked.get(fileName);
    if (done != null) {
      return done;
    }
    FileDescriptorProto proto = protos.get(fileName);
    if (proto == null) {
      remember(reflect(ServerReflectionRequest.newBuilder().setFileByFilename(fileName).build()));
      proto = protos.get(fileName);
    }
    List<FileDescriptor> deps = new ArrayList<>();
    for (String dep : proto.getDependencyList()) {
      deps.add(link(dep));
    }
    try {
      FileDescriptor file = FileDescriptor.buildFrom(proto, deps.toArray(FileDescriptor[]::new));
      linked.put(fileName, file);
      return file;
    } catch (DescriptorValidationException e) {
      throw new AssertionError("descriptor " + fileName + " does not link: " + e.getMessage(), e);
    }
  }

  /** One request on its own ServerReflectionInfo stream, as grpcurl's client does per lookup. */
  private ServerReflectionResponse reflect(ServerReflectionRequest request) {
    CompletableFuture<ServerReflectionResponse> result = new CompletableFuture<>();
    StreamObserver<ServerReflectionRequest> requests = ServerReflectionGrpc.newStub(channel)
        .withDeadlineAfter(10, TimeUnit.SECONDS)
        .serverReflectionInfo(new StreamObserver<>() {
          @Override
          public void onNext(ServerReflectionResponse value) {
            result.complete(value);
          }

          @Override
          public void onError(Throwable t) {
            result.completeExceptionally(t);
          }

          @Override
          public void onCompleted() {
            result.completeExceptionally(new AssertionError("reflection stream closed without an answer"));
          }
        });
    requests.onNext(request);
    try {
      ServerReflectionResponse response = result.get(10, TimeUnit.SECONDS);
      requests.onCompleted();
      return response;
    } catch (ExecutionException e) {
      throw new AssertionError("reflection failed: " + e.getCause(), e.getCause());
    } catch (InterruptedException | TimeoutException e) {
      requests.onError(e); // cancels the call
      throw new AssertionError("reflection did not answer: " + e, e);
    }
  }
}
