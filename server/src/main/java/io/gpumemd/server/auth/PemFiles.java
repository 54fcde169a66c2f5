package io.gpumemd.server.auth;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Reads the PEM files of the TLS options at start, so that a wrong file is a configuration
 * error naming the option ({@code tls-key: '/etc/k.pem' (expected: …)}) rather than a Netty
 * stack trace at the first handshake. Checks what Netty (without BouncyCastle) will accept:
 * X.509 certificates, and an unencrypted PKCS#8 private key that belongs to the certificate.
 * Stateless; every method throws {@link IllegalArgumentException} whose message is the
 * "expected" part of a configuration problem.
 */
public final class PemFiles {
  private static final Pattern KEY_BLOCK =
      Pattern.compile("-----BEGIN ([A-Z ]*)PRIVATE KEY-----([A-Za-z0-9+/=\\s]*)-----END \\1PRIVATE KEY-----");

  private PemFiles() {}

  /** The certificates of a PEM file, the first one the leaf; at least one. */
  public static List<X509Certificate> certificates(Path file) {
    byte[] bytes = read(file, "a PEM certificate file");
    List<X509Certificate> out = new ArrayList<>();
    try {
      for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(bytes))) {
        out.add((X509Certificate) c);
      }
    } catch (CertificateException e) {
      throw new IllegalArgumentException("a PEM certificate file; " + e.getMessage());
    }
    if (out.isEmpty()) {
      throw new IllegalArgumentException("a PEM certificate file (-----BEGIN CERTIFICATE-----); none found in it");
    }
    return out;
  }

  /** The unencrypted PKCS#8 private key of a PEM file (EC, RSA or Ed25519). */
  public static PrivateKey privateKey(Path file) {
    String text = new String(read(file, "a PEM private key file"), StandardCharsets.US_ASCII);
    Matcher m = KEY_BLOCK.matcher(text);
    if (!m.find()) {
      throw new IllegalArgumentException("a PEM private key file (-----BEGIN PRIVATE KEY-----); none found in it");
    }
    String kind = m.group(1).trim();
    if (kind.equals("ENCRYPTED")) {
      throw new IllegalArgumentException("an unencrypted private key; this one is encrypted (decrypt it with "
          + "'openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8')");
    }
    if (!kind.isEmpty()) {
      throw new IllegalArgumentException("a PKCS#8 private key (-----BEGIN PRIVATE KEY-----); this one is '"
          + kind + " PRIVATE KEY' (convert it with 'openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8')");
    }
    byte[] der;
    try {
      der = Base64.getMimeDecoder().decode(m.group(2));
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("a PEM private key file; its base64 is damaged");
    }
    for (String algorithm : List.of("EC", "RSA", "Ed25519")) {
      try {
        return KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
      } catch (GeneralSecurityException e) {
        // try the next algorithm
      }
    }
    throw new IllegalArgumentException("an EC, RSA or Ed25519 private key; this one cannot be decoded");
  }

  /**
   * Checks that {@code key} is the private half of the certificate's public key, by signing a
   * random message with one and verifying it with the other.
   */
  public static void checkPair(X509Certificate certificate, PrivateKey key) {
    String algorithm = switch (key.getAlgorithm()) {
      case "EC" -> "SHA256withECDSA";
      case "RSA" -> "SHA256withRSA";
      default -> key.getAlgorithm(); // Ed25519, EdDSA: the key's own algorithm
    };
    try {
      byte[] message = new byte[32];
      new SecureRandom().nextBytes(message);
      Signature signer = Signature.getInstance(algorithm);
      signer.initSign(key);
      signer.update(message);
      byte[] signature = signer.sign();
      Signature verifier = Signature.getInstance(algorithm);
      verifier.initVerify(certificate.getPublicKey());
      verifier.update(message);
      if (verifier.verify(signature)) {
        return;
      }
    } catch (GeneralSecurityException e) {
      // a key of another type than the certificate's: reported below
    }
    throw new IllegalArgumentException("the private key of the certificate in tls-cert ("
        + certificate.getSubjectX500Principal().getName() + "); this key does not match it");
  }

  private static byte[] read(Path file, String what) {
    try {
      return Files.readAllBytes(file);
    } catch (NoSuchFileException e) {
      throw new IllegalArgumentException(what + "; there is no such file");
    } catch (AccessDeniedException e) {
      throw new IllegalArgumentException(what + "; permission denied");
    } catch (IOException e) {
      throw new IllegalArgumentException(what + "; " + e.getMessage());
    }
  }
}
