"""Generated gRPC/protobuf code (make proto). Do not edit."""
