"""Code that runs in AWS. Each folder is one Lambda function's asset; it ships inside the wheel as
``rayito_constructs._lambdas``."""
