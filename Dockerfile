# One image for the Shepherd worker and localplane (and the CLI).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shepherd ./shepherd
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY localplane ./localplane
COPY examples ./examples
RUN pip install --no-cache-dir .
ENV SHEPHERD_LOG_FORMAT=json
ENTRYPOINT ["shepherd"]
CMD ["worker"]
